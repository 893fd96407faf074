// The `attn` program: everything lives in attn::tools::main so tests can run it in-process.
#include <iostream>

#include "commands.h"

int main(int argc, char** argv) { return attn::tools::main(argc, argv, std::cout, std::cerr); }
