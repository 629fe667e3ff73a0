/* floe CLI: one file per subcommand; each cmd_* gets argv after the subcommand name and returns
 * the process exit code (0 ok, 1 runtime error, 2 usage error). */
#ifndef FLOE_CLI_H
#define FLOE_CLI_H
int cmd_info(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_serve(int argc, char **argv);
/* Prints "floe: <msg>" to stderr and returns 1. */
int cli_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#endif
