/*
 * cmd_loadgen.c — `tern loadgen` (placeholder while the load generator is written).
 */
#include <stdio.h>

#include "cli.h"

int cmd_loadgen(int argc, char **argv) {
    (void)argc, (void)argv;
    return tn_cli_usage_error("loadgen: not implemented yet");
}
