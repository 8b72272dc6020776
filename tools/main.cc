// `gradfuzz`: a thin layer over tools/cli.h (style.md: the CLI main only wires things).
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "tools/cli.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + (argc > 0 ? 1 : 0), argv + argc);
  return gradfuzz::tools::run_cli(args, std::cout, std::cerr, ::isatty(::fileno(stderr)) != 0);
}
