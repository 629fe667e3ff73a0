/* floe_chat_render: the public face of src/tok/chat.c (Qwen ChatML templates). */
#include "floe.h"
#include "base/base.h"

int floe_chat_render(const floe_engine *e, const floe_chat_msg *msgs, size_t n, const floe_chat_opts *o, char **out,
                     char *err, size_t errlen) {
  (void)e; (void)msgs; (void)n; (void)o; *out = 0;
  return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "chat templates are not wired in yet");
}
