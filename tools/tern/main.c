/*
 * main.c — the `tern` command: a dispatch table of subcommands (cmd_<name>.c each).
 * Maps tern_status to sysexits-style exit codes (robustness.md §4): 64 usage, 65 bad data,
 * 66 missing input, 70 internal, 71 out of memory, 74 i/o, 130 interrupted.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static int cmd_version(int argc, char **argv) {
    (void)argc;
    (void)argv;
    printf("tern %s\n", tern_version_string());
    return 0;
}

static const tn_cmd tn_cmds[] = {
    {"version", cmd_version, "print version, commit and CPU features"},
#define TN_CMD(name, fn, help) {name, fn, help},
#include "commands.inc"
#undef TN_CMD
};

static void usage(FILE *f) {
    fprintf(f, "usage: tern <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof tn_cmds / sizeof tn_cmds[0]; i++) fprintf(f, "  %-12s %s\n", tn_cmds[i].name, tn_cmds[i].help);
    fprintf(f, "\nRun 'tern <command> --help' for a command's options.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return TN_EXIT_USAGE;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) return cmd_version(argc - 1, argv + 1);
    for (size_t i = 0; i < sizeof tn_cmds / sizeof tn_cmds[0]; i++)
        if (!strcmp(argv[1], tn_cmds[i].name)) return tn_cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "tern: error: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return TN_EXIT_USAGE;
}
