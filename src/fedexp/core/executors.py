from fedexp.engine.executors.select import *  # noqa: F403 - the old path, named by run dirs saved before engine/ and runtime/
