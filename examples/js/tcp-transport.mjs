// A capnp-es RPC transport over a TCP socket: Cap'n Proto's standard stream framing (a segment
// table, then the segments), which is what itxd (and every other Cap'n Proto RPC peer) speaks.
// capnp-es ships the RPC protocol but no network transport, so this is the one piece a Node
// client adds.
import net from "node:net";
import tls from "node:tls";
import { Message } from "capnp-es";
import { Message as RpcMessage } from "capnp-es/capnp/rpc";

export class TcpTransport {
  /** @param {net.Socket} socket */
  constructor(socket) {
    this.socket = socket;
    this.buffered = Buffer.alloc(0);
    this.inbox = []; // messages received before anyone asked for them
    this.waiting = []; // recvMessage calls waiting for a message: {resolve, reject}
    this.failure = undefined;
    socket.on("data", (chunk) => this.onData(chunk));
    socket.on("error", (err) => this.fail(err));
    socket.on("close", () => this.fail(new Error("disconnected: the connection to itxd closed")));
  }

  /**
   * Connects to host:port and resolves once the socket is open. With options.ca (PEM text of the
   * CA to trust), the connection is TLS and resolves once the handshake verified the server.
   */
  static connect(address, options = {}) {
    const at = address.lastIndexOf(":");
    const host = address.slice(0, at);
    const port = Number(address.slice(at + 1));
    const secure = options.ca !== undefined;
    const socket = secure
      ? tls.connect({ host, port, ca: options.ca, servername: net.isIP(host) ? undefined : host })
      : net.connect({ host, port });
    socket.setNoDelay(true);
    return new Promise((resolve, reject) => {
      socket.once(secure ? "secureConnect" : "connect", () => resolve(new TcpTransport(socket)));
      socket.once("error", reject);
    });
  }

  sendMessage(msg) {
    this.socket.write(new Uint8Array(msg.segment.message.toArrayBuffer()));
  }

  recvMessage() {
    if (this.inbox.length > 0) return Promise.resolve(this.inbox.shift());
    // capnp-es ends its receive loop on a rejection with no reason.
    if (this.failure) return Promise.reject();
    return new Promise((resolve, reject) => this.waiting.push({ resolve, reject }));
  }

  close() {
    this.socket.destroy();
  }

  onData(chunk) {
    this.buffered = Buffer.concat([this.buffered, chunk]);
    for (;;) {
      const size = frameSize(this.buffered);
      if (size === undefined || this.buffered.length < size) return;
      const frame = this.buffered.subarray(0, size);
      this.buffered = this.buffered.subarray(size);
      const bytes = frame.buffer.slice(frame.byteOffset, frame.byteOffset + frame.length);
      const msg = new Message(bytes, false).getRoot(RpcMessage);
      const waiter = this.waiting.shift();
      if (waiter) waiter.resolve(msg);
      else this.inbox.push(msg);
    }
  }

  fail(err) {
    if (this.failure) return;
    this.failure = err;
    for (const w of this.waiting.splice(0)) w.reject();
  }
}

// frameSize is the byte length of the first framed message in buf, or undefined until its
// segment table has arrived: a uint32 segment count - 1, a uint32 size in words per segment,
// padded to a whole word, then the segments.
function frameSize(buf) {
  if (buf.length < 4) return undefined;
  const segments = buf.readUInt32LE(0) + 1;
  const header = 4 * (1 + segments) + (segments % 2 === 0 ? 4 : 0);
  if (buf.length < header) return undefined;
  let words = 0;
  for (let i = 0; i < segments; i++) words += buf.readUInt32LE(4 + 4 * i);
  return header + 8 * words;
}
