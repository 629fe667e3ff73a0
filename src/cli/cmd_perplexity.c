/* floe perplexity: placeholder until the command lands. */
#include <stdio.h>
#include "cli/cli.h"
int cmd_perplexity(int argc, char **argv) {
  (void)argc;
  (void)argv;
  return cli_fail("perplexity: not implemented yet");
}
