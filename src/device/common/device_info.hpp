// What the kernels' choices need to know about the handle's GPU, queried once when the handle is
// made (the handle's device is the current one then) instead of at every FFN or call.
#pragma once

namespace twblas::cuda {

struct DeviceInfo {
    int device = 0;
    int sm_count = 132;
    bool masked_gate = false;  // the masked gate GEMM runs here (built for sm_90a, an sm_90 GPU)
    bool pdl = false;  // programmatic dependent launch: an sm_90+ GPU running code compiled for
                       // compute_90+ (the kernels' grid-dependency calls exist only there)
    int smem_optin = 48 * 1024;  // shared memory a block may take with its attribute raised
};

/// The current device's; the defaults above where the runtime does not answer (the handle's
/// creation has already refused a machine without a usable GPU).
DeviceInfo current_device_info();

}  // namespace twblas::cuda
