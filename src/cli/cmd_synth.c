int cmd_synth(int argc, char **argv) { (void)argc; (void)argv; return 2; } /* replaced by cmd_synth.c */
