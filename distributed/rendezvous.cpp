// TCP rendezvous for the NCCL id (distributed/rendezvous.h). Blocking sockets driven by poll() with deadlines, so
// no step waits past the timeout.
#include "dyngrad/distributed/rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>

#include "dyngrad/core/error.h"

namespace dyngrad::dist {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::uint32_t kMagic = 0x64677264;  // "dgrd"

struct Socket {
    int fd = -1;
    explicit Socket(int f = -1) : fd(f) {}
    Socket(Socket&& o) noexcept : fd(o.fd) { o.fd = -1; }
    Socket& operator=(Socket&& o) noexcept {
        std::swap(fd, o.fd);
        return *this;
    }
    Socket(const Socket&) = delete;
    ~Socket() {
        if (fd >= 0) ::close(fd);
    }
};

int remaining_ms(Clock::time_point deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    return left <= 0 ? 0 : static_cast<int>(std::min<long long>(left, 1 << 30));
}

std::string prefix(int rank, int world) { return str("rendezvous (rank ", rank, "/", world, "): "); }

// Waits for `events` on fd until the deadline; false on timeout.
bool wait_for(int fd, short events, Clock::time_point deadline) {
    pollfd p{fd, events, 0};
    for (;;) {
        const int r = ::poll(&p, 1, remaining_ms(deadline));
        if (r > 0) return true;
        if (r == 0) return false;
        if (errno != EINTR) return false;
    }
}

void send_all(int fd, const void* data, std::size_t bytes, Clock::time_point deadline, const std::string& what) {
    const char* p = static_cast<const char*>(data);
    while (bytes > 0) {
        if (!wait_for(fd, POLLOUT, deadline)) throw DistributedError(what + "timed out sending");
        const ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n <= 0) throw DistributedError(str(what, "send failed: ", std::strerror(errno)));
        p += n;
        bytes -= static_cast<std::size_t>(n);
    }
}

void recv_all(int fd, void* data, std::size_t bytes, Clock::time_point deadline, const std::string& what) {
    char* p = static_cast<char*>(data);
    while (bytes > 0) {
        if (!wait_for(fd, POLLIN, deadline)) throw DistributedError(what + "timed out receiving");
        const ssize_t n = ::recv(fd, p, bytes, 0);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n == 0) throw DistributedError(what + "the peer closed the connection");
        if (n < 0) throw DistributedError(str(what, "receive failed: ", std::strerror(errno)));
        p += n;
        bytes -= static_cast<std::size_t>(n);
    }
}

std::vector<char> serve(int port, int world, const std::vector<char>& blob, Clock::time_point deadline,
                        double timeout) {
    const std::string what = prefix(0, world);
    Socket listener(::socket(AF_INET6, SOCK_STREAM, 0));
    bool v6 = listener.fd >= 0;
    if (!v6) listener = Socket(::socket(AF_INET, SOCK_STREAM, 0));
    if (listener.fd < 0) throw DistributedError(str(what, "socket: ", std::strerror(errno)));
    const int one = 1, zero = 0;
    ::setsockopt(listener.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    int bound;
    if (v6) {
        ::setsockopt(listener.fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);  // IPv4 peers too
        sockaddr_in6 addr{};
        addr.sin6_family = AF_INET6;
        addr.sin6_addr = in6addr_any;
        addr.sin6_port = htons(static_cast<std::uint16_t>(port));
        bound = ::bind(listener.fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    } else {
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_addr.s_addr = htonl(INADDR_ANY);
        addr.sin_port = htons(static_cast<std::uint16_t>(port));
        bound = ::bind(listener.fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    }
    if (bound != 0 || ::listen(listener.fd, world) != 0)
        throw DistributedError(str(what, "cannot listen on port ", port, ": ", std::strerror(errno),
                                   " (set DYNGRAD_RENDEZVOUS_PORT to a free port)"));
    std::vector<char> arrived(static_cast<std::size_t>(world), 0);
    arrived[0] = 1;
    for (int served = 1; served < world;) {
        if (!wait_for(listener.fd, POLLIN, deadline)) {
            std::string missing;
            for (int r = 1; r < world; ++r)
                if (!arrived[static_cast<std::size_t>(r)]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
            throw DistributedError(str(what, "timed out after ", timeout, " s waiting for rank(s) ", missing,
                                       " on port ", port, " (a peer died or never started; DYNGRAD_DIST_TIMEOUT)"));
        }
        Socket peer(::accept(listener.fd, nullptr, nullptr));
        if (peer.fd < 0) continue;
        std::int32_t hello[3];
        recv_all(peer.fd, hello, sizeof hello, deadline, what);
        if (static_cast<std::uint32_t>(hello[0]) != kMagic)
            throw DistributedError(str(what, "a connection on port ", port, " is not a dyngrad rank (bad greeting)"));
        if (hello[2] != world)
            throw DistributedError(str(what, "rank ", hello[1], " was started with world size ", hello[2],
                                       ", this rank with ", world));
        if (hello[1] <= 0 || hello[1] >= world || arrived[static_cast<std::size_t>(hello[1])])
            throw DistributedError(str(what, "rank ", hello[1], " arrived twice or is out of range 1..", world - 1));
        arrived[static_cast<std::size_t>(hello[1])] = 1;
        const std::uint32_t size = static_cast<std::uint32_t>(blob.size());
        send_all(peer.fd, &size, sizeof size, deadline, what);
        send_all(peer.fd, blob.data(), blob.size(), deadline, what);
        ++served;
    }
    return blob;
}

std::vector<char> join(const std::string& master_addr, int port, int rank, int world, Clock::time_point deadline,
                       double timeout) {
    const std::string what = prefix(rank, world);
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const std::string service = std::to_string(port);
    if (const int e = ::getaddrinfo(master_addr.c_str(), service.c_str(), &hints, &found); e != 0)
        throw DistributedError(str(what, "cannot resolve MASTER_ADDR '", master_addr, "': ", ::gai_strerror(e)));
    std::unique_ptr<addrinfo, void (*)(addrinfo*)> addresses(found, ::freeaddrinfo);
    // Rank 0 may not listen yet: retry until the deadline.
    for (;;) {
        for (addrinfo* a = addresses.get(); a; a = a->ai_next) {
            Socket s(::socket(a->ai_family, a->ai_socktype, a->ai_protocol));
            if (s.fd < 0) continue;
            if (::connect(s.fd, a->ai_addr, a->ai_addrlen) != 0) continue;
            const std::int32_t hello[3] = {static_cast<std::int32_t>(kMagic), rank, world};
            send_all(s.fd, hello, sizeof hello, deadline, what);
            std::uint32_t size = 0;
            recv_all(s.fd, &size, sizeof size, deadline, what);
            if (size > (1u << 20)) throw DistributedError(str(what, "rank 0 announced a blob of ", size, " bytes"));
            std::vector<char> blob(size);
            recv_all(s.fd, blob.data(), size, deadline, what);
            return blob;
        }
        if (remaining_ms(deadline) == 0)
            throw DistributedError(str(what, "timed out after ", timeout, " s connecting to rank 0 at ", master_addr,
                                       ":", port, " (rank 0 died or never started; DYNGRAD_DIST_TIMEOUT)"));
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
}

}  // namespace

std::vector<char> rendezvous_exchange(const std::string& master_addr, int port, int rank, int world,
                                      const std::vector<char>& blob, double timeout_seconds) {
    if (world < 1 || rank < 0 || rank >= world)
        throw ValueError(str("rendezvous: rank ", rank, " of world size ", world, " (need 0 <= rank < world)"));
    if (port <= 0 || port > 65535) throw ValueError(str("rendezvous: port ", port, " is not in 1..65535"));
    if (!(timeout_seconds > 0)) throw ValueError(str("rendezvous: timeout ", timeout_seconds, " s is not positive"));
    if (world == 1) return blob;
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(timeout_seconds));
    return rank == 0 ? serve(port, world, blob, deadline, timeout_seconds)
                     : join(master_addr, port, rank, world, deadline, timeout_seconds);
}

}  // namespace dyngrad::dist
