"""`python -m ctxrep ...`, as the `ctxrep` script: what `torchrun --nproc_per_node N -m ctxrep ...` runs in each process."""

from ctxrep.cli import main

if __name__ == "__main__":
    main()
