"""The old path of `fedexp.engine.executors.vectorized`, re-exported: removed in fedexp 0.2.0.

Run dirs saved before engine/ and runtime/ existed name `fedexp.core.vectorized.VectorizedExecutor`
(executor=vectorized) as a `_target_` in their `.hydra/config.yaml`, and resume through this
module. fedexp 0.2.0, the next minor release, drops it: resume such a run dir with 0.1.x. The old
paths are listed in docs/lifecycle.md ("Old module paths").
"""

from fedexp.engine.executors.vectorized import *  # noqa: F403
