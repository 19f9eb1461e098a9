"""Train GPT-2. With no arguments: the Shakespeare default on a small preset on CPU (about 5
minutes on 2 cores), or GPT-2 124M in bf16 on a GPU. See --help for every flag."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from training.cli import main  # noqa: E402

if __name__ == "__main__":
    main()
