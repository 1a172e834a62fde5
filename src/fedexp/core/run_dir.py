from fedexp.runtime.run_dir import *  # noqa: F403 - the old path, named by run dirs saved before engine/ and runtime/
