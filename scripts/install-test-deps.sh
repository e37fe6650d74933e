#!/usr/bin/env bash
# Installs what scripts/install-deps.sh installs and, on top, the Debian 12 packages only the tests
# need. Idempotent; uses sudo when not run as root.
#   libcmocka-dev            unit tests (tests/*/test_*.c; CMake builds no tests without it)
#   python3, curl            serve, profile, spec and perplexity tests (python3 and curl clients)
#   python3-torch            training golden test (tests/train/test_golden.c vs scripts/train_golden.py)
#   bible-kjv                train_default_model_short (the default model's corpus, scripts/make-kjv-corpus.sh)
#   clang-14, libclang-rt-14-dev   CI's clang build (.ci/run) and fuzzing (TERN_FUZZ)
#   libopenmpi-dev, openmpi-bin    tern train --dist and its tests (tests/train/dist_test.sh, mpirun -np 2;
#                                  as root they need OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1,
#                                  which the test sets); without them those tests skip and --dist says so
#   (serve_openai_npm also runs the openai npm client where node and npm are installed; skipped without)
set -euo pipefail
exec bash "$(dirname "$0")/install-deps.sh" libcmocka-dev python3 curl python3-torch bible-kjv \
     clang-14 libclang-rt-14-dev libopenmpi-dev openmpi-bin
