/* Architecture names: the GGUF `general.architecture` spelling of each FLOE_ARCH_*. */
#include <string.h>

#include "base/hparams.h"

static const char *const arch_names[] = {
    [FLOE_ARCH_UNKNOWN] = "unknown",
    [FLOE_ARCH_QWEN3MOE] = "qwen3moe",
    [FLOE_ARCH_QWEN3NEXT] = "qwen3next",
    [FLOE_ARCH_QWEN35MOE] = "qwen35moe",
};

const char *floe_arch_name(int arch) {
  if (arch <= FLOE_ARCH_UNKNOWN || arch > FLOE_ARCH_QWEN35MOE) return "unknown";
  return arch_names[arch];
}

int floe_arch_from_name(const char *name) {
  if (!name) return FLOE_ARCH_UNKNOWN;
  for (int a = FLOE_ARCH_QWEN3MOE; a <= FLOE_ARCH_QWEN35MOE; a++)
    if (!strcmp(name, arch_names[a])) return a;
  return FLOE_ARCH_UNKNOWN;
}
