from fedexp.engine.executors.distributed import *  # noqa: F403 - the old path, named by run dirs saved before engine/ and runtime/
