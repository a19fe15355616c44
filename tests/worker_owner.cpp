// A process that owns a WorkerPool, for tests of what happens to the workers
// when it ends: `exit` (normally), `throw` (an uncaught exception), `hang`
// (waits to be killed). It writes the workers' pids to the file it is given.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "worker/worker_pool.hpp"

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  kiln::WorkerPool pool(kiln::WorkerPool::find_exe({}), 2);
  pool.warm();
  {
    std::ofstream out(std::string(argv[2]) + ".tmp");
    for (pid_t p : pool.pids()) out << p << "\n";
  }
  std::rename((std::string(argv[2]) + ".tmp").c_str(), argv[2]);
  if (std::strcmp(argv[1], "throw") == 0) throw std::runtime_error("the owner fails");
  if (std::strcmp(argv[1], "hang") == 0)
    for (;;) ::pause();
  return 0;
}
