import type { Socket } from "bun";
import type { BenchRequest } from "./requests.ts";

/** The raw bytes of a request, ready to write to a keep-alive connection. */
export function encodeRequest(request: BenchRequest, host: string): Uint8Array {
  const body = Buffer.from(request.body);
  let head = `${request.method} ${request.path} HTTP/1.1\r\nhost: ${host}\r\n`;
  for (const [name, value] of Object.entries(request.headers)) head += `${name}: ${value}\r\n`;
  if (body.length > 0 || request.method === "POST" || request.method === "DELETE") {
    head += `content-length: ${body.length}\r\n`;
  }
  return Buffer.concat([Buffer.from(`${head}\r\n`), body]);
}

export interface Http1Response {
  status: number;
  body: Buffer;
}

interface Pending {
  resolve: (response: Http1Response) => void;
  reject: (error: Error) => void;
}

/**
 * A minimal HTTP/1.1 keep-alive client connection: one request at a time, responses framed by
 * Content-Length (what Bun.serve sends). Small enough that a load generator using it spends its
 * time on the wire, not in a client library.
 */
export class Http1Connection {
  private buffer: Buffer = Buffer.alloc(0);
  private pending: Pending | undefined;
  private closed = false;
  /** Bytes of the current response received so far (0: the server has not started answering). */
  private received = 0;
  /** Called once when the connection closes (the server closes idle keep-alive connections). */
  onClose: () => void = () => {};

  private constructor(private socket: Socket<undefined> | undefined) {}

  get busy(): boolean {
    return this.pending !== undefined;
  }

  get open(): boolean {
    return !this.closed;
  }

  static async connect(hostname: string, port: number): Promise<Http1Connection> {
    const connection = new Http1Connection(undefined);
    connection.socket = await Bun.connect({
      hostname,
      port,
      socket: {
        data: (_socket, data) => connection.onData(data),
        close: () => connection.closedBy(new Error("connection closed")),
        error: (_socket, error) => connection.closedBy(error),
      },
    });
    connection.socket.setNoDelay(true);
    return connection;
  }

  /** True when the last failure happened before any byte of a response arrived (safe to resend). */
  get failedBeforeResponse(): boolean {
    return this.received === 0;
  }

  request(raw: Uint8Array): Promise<Http1Response> {
    if (this.closed || !this.socket) return Promise.reject(new Error("connection closed"));
    if (this.pending) return Promise.reject(new Error("connection busy"));
    this.received = 0;
    return new Promise((resolve, reject) => {
      this.pending = { resolve, reject };
      const written = this.socket?.write(raw) ?? 0;
      if (written < raw.length) this.flushRest(raw.subarray(written));
    });
  }

  close(): void {
    this.closed = true;
    this.socket?.end();
  }

  /** Large writes the kernel did not take at once are retried (rare for requests of a few KB). */
  private flushRest(rest: Uint8Array): void {
    const retry = () => {
      if (this.closed || !this.socket) return;
      const written = this.socket.write(rest);
      if (written < rest.length) {
        rest = rest.subarray(written);
        setTimeout(retry, 0);
      }
    };
    setTimeout(retry, 0);
  }

  private onData(data: Buffer): void {
    this.received += data.length;
    this.buffer = this.buffer.length === 0 ? Buffer.from(data) : Buffer.concat([this.buffer, data]);
    const headerEnd = this.buffer.indexOf("\r\n\r\n");
    if (headerEnd === -1) return;
    const head = this.buffer.subarray(0, headerEnd).toString("latin1");
    const status = Number(head.slice(9, 12));
    const length = /\r\ncontent-length:\s*(\d+)/i.exec(head);
    if (!length) {
      this.fail(new Error(`response without content-length: ${head.split("\r\n")[0]}`));
      return;
    }
    const total = headerEnd + 4 + Number(length[1]);
    if (this.buffer.length < total) return;
    const body = this.buffer.subarray(headerEnd + 4, total);
    this.buffer = this.buffer.subarray(total);
    const pending = this.pending;
    this.pending = undefined;
    pending?.resolve({ status, body });
  }

  private closedBy(error: Error): void {
    const first = !this.closed;
    this.closed = true;
    this.fail(error);
    if (first) this.onClose();
  }

  private fail(error: Error): void {
    const pending = this.pending;
    this.pending = undefined;
    pending?.reject(error);
  }
}
