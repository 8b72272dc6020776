// `gradfuzz`: a thin layer over tools/cli.h (style.md: the CLI main only wires things).
#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "tools/cli.h"

int main(int argc, char** argv) {
  // A campaign allocates and frees tensors of a few KiB thousands of times a second. glibc's
  // defaults hand freed memory back to the kernel and fault it in again at the next case;
  // keeping it (bounded: the working set is a few MiB) saves page faults and trims.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 128 << 20);
  mallopt(M_TOP_PAD, 16 << 20);
  // Pipes to workers and adapters: a peer that died is an error to handle (EPIPE), not a
  // reason for this process to die.
  ::signal(SIGPIPE, SIG_IGN);
  std::vector<std::string> args(argv + (argc > 0 ? 1 : 0), argv + argc);
  return gradfuzz::tools::run_cli(args, std::cout, std::cerr, ::isatty(::fileno(stderr)) != 0);
}
