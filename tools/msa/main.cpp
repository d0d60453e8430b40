// The msa command (placeholder until the subcommands land).
#include <cstdio>

int main() {
  std::puts("msa");
  return 0;
}
