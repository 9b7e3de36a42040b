#include "dyngrad/core/error.h"

#include <exception>

namespace dyngrad {

[[noreturn]] void throw_not_built(const std::string& what, const char* missing) {
    throw DeviceError(str(what, ": this build of dyngrad has no ", missing));
}

[[noreturn]] void rethrow_with_context(const std::string& context) {
    // Called outside a catch block, the bare `throw;` below would call std::terminate: a typed error instead.
    if (!std::current_exception())
        throw ValueError(str("rethrow_with_context(\"", context,
                             "\"): no exception is being handled; call it inside a catch block"));
    std::string prefix = context;
    prefix += ": ";
    // Most derived types first.
    try {
        throw;
    } catch (const OutOfMemory& e) {
        throw OutOfMemory(prefix + e.what());
    } catch (const CudaError& e) {
        throw CudaError(prefix + e.what());
    } catch (const ShapeError& e) {
        throw ShapeError(prefix + e.what());
    } catch (const DTypeError& e) {
        throw DTypeError(prefix + e.what());
    } catch (const DeviceError& e) {
        throw DeviceError(prefix + e.what());
    } catch (const GraphError& e) {
        throw GraphError(prefix + e.what());
    } catch (const IndexError& e) {
        throw IndexError(prefix + e.what());
    } catch (const ValueError& e) {
        throw ValueError(prefix + e.what());
    } catch (const IoError& e) {
        throw IoError(prefix + e.what());
    } catch (const NumericalError& e) {
        throw NumericalError(prefix + e.what());
    } catch (const DistributedError& e) {
        throw DistributedError(prefix + e.what());
    } catch (const Error& e) {
        throw Error(prefix + e.what());
    } catch (const std::bad_alloc&) {
        throw Error(prefix + "host out of memory");
    } catch (const std::exception& e) {
        throw Error(prefix + e.what());
    }
}

}  // namespace dyngrad
