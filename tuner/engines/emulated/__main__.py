"""``python -m tuner.engines.emulated serve MODEL <vllm serve flags>`` (see :mod:`.cli`)."""

import logging
import os
import sys

from tuner.engines.emulated.cli import main

code = main()
# Leave without the interpreter's finalisation: with a client's keep-alive connection still open, the
# finalisers of the libraries vLLM's parser imports held the exit for 9-15 s (measured), every stop of
# every launch. Everything of ours is closed by now; flush what is buffered and go.
logging.shutdown()
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)
