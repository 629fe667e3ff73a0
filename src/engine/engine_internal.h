/* Engine internals shared by the files of src/engine (not part of the public API). */
#ifndef FLOE_ENGINE_INTERNAL_H
#define FLOE_ENGINE_INTERNAL_H
#include "floe.h"
#include "tok/tokenizer.h"

const tok_vocab *engine_tok(const floe_engine *e);
int engine_arch(const floe_engine *e); /* enum floe_arch */
#endif
