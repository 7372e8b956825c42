#include "nccl/blocking_wait.h"

#include <atomic>

namespace nccl_core {

namespace {
std::atomic<BlockingWaitRunner> runner{nullptr};
} // namespace

void setBlockingWaitRunner(BlockingWaitRunner newRunner) {
  runner.store(newRunner);
}

void runBlockingWait(void (*wait)(void*), void* arg) {
  if (BlockingWaitRunner run = runner.load()) {
    run(wait, arg);
  } else {
    wait(arg);
  }
}

} // namespace nccl_core
