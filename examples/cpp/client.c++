// A C++ client of itxd written from schema/itx.capnp alone, on Debian's libcapnp-dev (a
// capnp::TwoPartyClient over a kj stream, TLS from kj-tls when given a CA). It logs in, appends a
// batch through one pipelined chain, pages through the stream, matches an error by its code, and
// mounts a Receiver that an itx-call subscription delivers to. Build (from the repository root):
//
//   mkdir -p out
//   capnp compile -I schema/include -oc++:out --src-prefix=schema schema/itx.capnp
//   g++ -std=c++17 -Iout examples/cpp/client.c++ out/itx.capnp.c++ $(pkg-config --cflags --libs capnp-rpc kj-tls) -o itx-example
//   ./itx-example 127.0.0.1:7878 itx_...
//   ./itx-example 127.0.0.1:7878 itx_... itxd.crt localhost   # over TLS, trusting that CA,
//                                                             # the certificate naming localhost
// (kj-tls in capnp 0.9 checks the certificate against a DNS name, never an IP address: name the
// server as its certificate does when dialing an IP.)
#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>
#include <kj/async.h>
#include <kj/compat/tls.h>
#include <kj/debug.h>

#include <cctype>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "itx.capnp.h"

namespace {

// errorCode returns the itx code of an exception: the first "itx.<code>: " in its reason. The
// RPC library puts its own text in front ("remote exception: ..."), so never match a prefix.
std::string errorCode(const kj::Exception& e) {
  std::string reason = e.getDescription().cStr();
  for (size_t at = reason.find("itx."); at != std::string::npos; at = reason.find("itx.", at + 4)) {
    size_t start = at + 4, end = start;
    while (end < reason.size() && std::isalpha(static_cast<unsigned char>(reason[end]))) end++;
    if (end > start && reason.compare(end, 2, ": ") == 0) return reason.substr(start, end - start);
  }
  return "";
}

// Inbox is a Receiver: the server calls receive with each batch of the subscription. Returning
// acknowledges the whole batch.
class Inbox final : public Receiver::Server {
 public:
  explicit Inbox(kj::Own<kj::PromiseFulfiller<std::string>> got) : got(kj::mv(got)) {}

 protected:
  kj::Promise<void> receive(ReceiveContext context) override {
    auto batch = context.getParams().getBatch();
    for (auto e : batch.getEvents()) {
      if (e.getType() == "example/ping" && got->isWaiting()) {
        got->fulfill(std::string("receiver got example/ping at offset ") + std::to_string(e.getOffset()) +
                     " from " + batch.getPath().cStr());
      }
    }
    return kj::READY_NOW;
  }

 private:
  kj::Own<kj::PromiseFulfiller<std::string>> got;
};

std::string readFile(const char* name) {
  std::ifstream in(name);
  KJ_REQUIRE(in.good(), "cannot read the CA file", name);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || argc > 5) {
    std::cerr << "usage: " << argv[0] << " <host:port> <token> [ca.pem [server-name]]" << std::endl;
    return 2;
  }
  auto io = kj::setupAsyncIo();
  auto& ws = io.waitScope;
  kj::Maybe<kj::Own<kj::TlsContext>> tls;  // declared first: it outlives the socket it wraps
  auto socket = io.provider->getNetwork().parseAddress(argv[1]).wait(ws)->connect().wait(ws);
  if (argc >= 4) {
    // Trust only the given CA; the certificate must name the host (or IP) dialed.
    auto pem = readFile(argv[3]);
    kj::TlsCertificate ca(kj::StringPtr(pem.c_str()));
    kj::TlsContext::Options options;
    options.useSystemTrustStore = false;
    options.trustedCertificates = kj::arrayPtr(&ca, 1);
    auto context = kj::heap<kj::TlsContext>(kj::mv(options));
    std::string host(argv[1]);
    host = argc == 5 ? std::string(argv[4]) : host.substr(0, host.rfind(':'));
    socket = context->wrapClient(kj::mv(socket), host.c_str()).wait(ws);
    tls = kj::mv(context);
  }
  capnp::TwoPartyClient client(*socket);
  auto gateway = client.bootstrap().castAs<Gateway>();

  // login -> streams() -> get(path): three pipelined calls, nothing awaited yet.
  auto login = gateway.loginRequest();
  login.setToken(argv[2]);
  auto project = login.send().getProject();
  auto get = project.streamsRequest().send().getStreams().getRequest();
  get.setPath("/examples/cpp");
  auto stream = get.send().getStream();

  // The append travels with the chain: the first answer the client waits for is its result.
  auto append = stream.appendRequest();
  auto events = append.initEvents(3);
  for (unsigned i = 0; i < 3; i++) {
    events[i].setType("example/note");
    events[i].setPayload(("{\"n\": " + std::to_string(i + 1) + "}").c_str());
  }
  auto appended = append.send().wait(ws).getResult();
  std::cout << "appended " << appended.getOffsets().size() << " events, head " << appended.getHeadOffset() << std::endl;

  // Paging: two events a page, continuing from nextAfter until a page comes back empty.
  uint64_t after = 0, seen = 0, pages = 0;
  for (;;) {
    auto req = stream.getEventPageRequest();
    req.initQuery().setAfter(after);
    req.getQuery().setLimit(2);
    auto page = req.send().wait(ws).getPage();
    if (page.getEvents().size() == 0) break;
    seen += page.getEvents().size();
    pages++;
    after = page.getNextAfter();
  }
  std::cout << "paged " << seen << " events in " << pages << " pages" << std::endl;

  // An error, matched by its code.
  try {
    auto bad = stream.appendRequest();
    bad.initEvents(1)[0].setType("");
    bad.send().wait(ws);
    std::cout << "error: none" << std::endl;
  } catch (const kj::Exception& e) {
    std::cout << "error code " << errorCode(e) << std::endl;
  }

  // A mounted Receiver, delivered to by an itx-call subscription. The handle keeps the mount.
  auto paf = kj::newPromiseAndFulfiller<std::string>();
  auto mount = project.capabilitiesRequest().send().getCapabilities().mountRequest();
  mount.setName("example-inbox");
  mount.setReceiver(kj::heap<Inbox>(kj::mv(paf.fulfiller)));
  auto handle = mount.send().wait(ws).getHandle();

  auto configure = stream.subscriptionsRequest().send().getSubscriptions().configureRequest();
  auto config = configure.initConfig();
  config.setName("example-hook");
  config.initReceiver().initItxCall().setCapability("example-inbox");
  config.setStart(StartPosition::NOW);  // beginning (the default) would deliver stream/* records too
  configure.send().wait(ws);

  auto ping = stream.appendRequest();
  ping.initEvents(1)[0].setType("example/ping");
  ping.send().wait(ws);

  auto timeout = io.provider->getTimer().afterDelay(20 * kj::SECONDS).then([]() -> std::string {
    return "receiver: timed out";
  });
  std::cout << paf.promise.exclusiveJoin(kj::mv(timeout)).wait(ws) << std::endl;
  handle.cancelRequest().send().wait(ws);
  return 0;
}
