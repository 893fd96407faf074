// Links attn::dist from the installed package (tests/package/CMakeLists.txt): the ring entry point resolves.
#include <attn/dist.h>

int main() {
  auto* ring = &attn::dist::ring_attention;
  return ring ? 0 : 1;
}
