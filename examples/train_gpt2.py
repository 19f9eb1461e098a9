"""Train GPT-2. With no arguments: the Shakespeare default on a small preset on CPU (about 5
minutes on 2 cores), or GPT-2 124M in bf16 on a GPU. See --help for every flag."""

from training.cli import main

if __name__ == "__main__":
    main()
