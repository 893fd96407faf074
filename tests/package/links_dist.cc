// Links attn::dist from the installed package (tests/package/CMakeLists.txt): the ring entry point resolves (the
// pointer depends on argc, so the reference stays in the program).
#include <attn/dist.h>

int main(int argc, char**) {
  auto* ring = argc > 0 ? &attn::dist::ring_attention : nullptr;
  return ring ? 0 : 1;
}
