// Device communicators (nccl4py's Communicator.create_dev_comm): ncclDevComm
// for kernels that communicate themselves. The requirement and comm structs are
// laid out per NCCL release, so this part runs only on the NCCL minor release
// it was built against.
#pragma once

#include <nccl.h>

#include <map>
#include <memory>
#include <string>

#include "nccl/resources.h"

namespace nccl_core {

class DevComm final : public CommResource {
 public:
  DevComm(std::weak_ptr<Communicator> comm, std::shared_ptr<void> devComm);

  // Address of the host-side ncclDevComm_t, to pass to a kernel by value.
  uintptr_t ptr() const;
  int lsaRank() const;
  int lsaSize() const;
  const char* kind() const override {
    return "device communicator";
  }

 private:
  void release(const NcclApi& api, ncclComm_t comm) noexcept override;

  const std::shared_ptr<void> devComm_; // an ncclDevComm_t
};

// ncclDevCommRequirements fields set by name (the rest keep NCCL's
// defaults). A field this build's NCCL lacks raises NotImplementedError.
std::shared_ptr<DevComm> createDevComm(
    Communicator& comm,
    const std::map<std::string, int64_t>& requirements);

} // namespace nccl_core
