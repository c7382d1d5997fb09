"""``python -m omni_rt.engine.llama_cpp build|locate``: build or find the cached ``llama-server``."""

import logging
import sys

from omni_rt.engine.llama_cpp.build import _main

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    raise SystemExit(_main(sys.argv[1:]))
