// Hostile values of DYNGRAD_ATTENTION_KERNELS (ops/attention_geometry.h, attention_kernel_set_from): the variable
// picks attention's tensor-core kernel set once per process, so a misspelt value must fail loudly instead of
// silently running the default set. Each names the variable and the accepted values.
#include <string>
#include <vector>

#include "dyngrad/dyngrad.h"
#include "dyngrad/ops/attention_geometry.h"
#include "hostile.h"

using namespace dyngrad;

namespace {

hostile::Case bad_value(const std::string& value) {
    return hostile::expect<ValueError>(
        "DYNGRAD_ATTENTION_KERNELS='" + value + "'", {"DYNGRAD_ATTENTION_KERNELS", "'" + value + "'", "mma", "wmma"},
        [value] { attention_kernel_set_from(value.c_str()); });
}

const bool added = hostile::add("attention kernels", {
                                                         bad_value("WMMA"),
                                                         bad_value("MMA"),
                                                         bad_value("wmma "),
                                                         bad_value(" mma"),
                                                         bad_value("mma.sync"),
                                                         bad_value("tc"),
                                                         bad_value("simt"),
                                                         bad_value("1"),
                                                         bad_value("0"),
                                                         bad_value("cudnn"),
                                                     });

}  // namespace
