#include "entries.hpp"
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kiln::fuzz::program_one(data, size);
  return 0;
}
