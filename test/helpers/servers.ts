/**
 * Small real servers on loopback for tests. Each listens on a free port
 * (port 0) and returns `{ host, port, close() }`; `close()` destroys open
 * connections, so it never waits for clients.
 */
import { createCipheriv, createHash } from 'node:crypto';
import * as http from 'node:http';
import * as https from 'node:https';
import * as net from 'node:net';

export interface TestServer {
  host: string;
  port: number;
  /** Destroys open connections and stops listening. */
  close(): Promise<void>;
}

export interface SinkResult {
  /** Bytes received on the connection. */
  bytes: number;
  /** Hex sha256 of those bytes. */
  sha256: string;
}

export interface SinkServer extends TestServer {
  /**
   * Resolves when the `index`-th accepted connection (0-based, accept order)
   * has ended or closed. May be called before that connection arrives.
   */
  result(index?: number): Promise<SinkResult>;
}

export interface SourceServer extends TestServer {
  /** Number of bytes each connection receives. */
  bytes: number;
  /** Hex sha256 of those bytes. */
  sha256: string;
  /** The bytes themselves. */
  data: Buffer;
}

export interface SilentServer extends TestServer {
  /** Number of connections accepted so far. */
  readonly connections: number;
}

export interface HttpTestServer extends TestServer {
  /** "http://host:port" or "https://host:port". */
  url: string;
}

type Listening = net.Server | http.Server | https.Server;

/** Listens on host:0, tracks sockets, and builds the common `TestServer`. */
async function listen(server: Listening, host: string): Promise<TestServer> {
  const sockets = new Set<net.Socket>();
  server.on('connection', (s: net.Socket) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const { port } = server.address() as net.AddressInfo;
  return {
    host,
    port,
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

/** TCP echo. Half-close passes through: when the client ends, the server ends after echoing. */
export interface EchoServer extends TestServer {
  /** Connections accepted so far. */
  connections(): number;
}

export async function startEchoServer(host = '127.0.0.1'): Promise<EchoServer> {
  let accepted = 0;
  const server = net.createServer({ allowHalfOpen: true }, (s) => {
    accepted++;
    s.on('error', () => {});
    s.pipe(s); // pipe() ends the writable side when the readable side ends
  });
  return { ...(await listen(server, host)), connections: () => accepted };
}

/** Reads everything and records the byte count and sha256 of each connection. */
export async function startSinkServer(host = '127.0.0.1'): Promise<SinkServer> {
  const waiters: Array<{ promise: Promise<SinkResult>; resolve: (r: SinkResult) => void }> = [];
  const slot = (i: number) => {
    while (waiters.length <= i) {
      let resolve!: (r: SinkResult) => void;
      const promise = new Promise<SinkResult>((r) => (resolve = r));
      waiters.push({ promise, resolve });
    }
    return waiters[i]!;
  };
  let accepted = 0;
  const server = net.createServer({ allowHalfOpen: true }, (s) => {
    const { resolve } = slot(accepted++);
    const hash = createHash('sha256');
    let bytes = 0;
    s.on('data', (d: Buffer) => {
      bytes += d.length;
      hash.update(d);
    });
    let finished = false;
    const done = () => {
      if (finished) return;
      finished = true;
      resolve({ bytes, sha256: hash.digest('hex') });
    };
    s.once('end', () => {
      s.end();
      done();
    });
    s.once('close', done); // reset/destroyed: report what arrived
    s.on('error', () => {});
  });
  return { ...(await listen(server, host)), result: (index = 0) => slot(index).promise };
}

/** Deterministic pseudo-random bytes: AES-128-CTR keystream with a fixed key. */
export function pseudoRandomBytes(n: number, seed = 1): Buffer {
  const key = Buffer.alloc(16, seed & 0xff);
  return createCipheriv('aes-128-ctr', key, Buffer.alloc(16)).update(Buffer.alloc(n));
}

/** Sends the same `bytes` deterministic pseudo-random bytes on every connection, then ends. */
export async function startSourceServer(host = '127.0.0.1', bytes = 1 << 20): Promise<SourceServer> {
  const data = pseudoRandomBytes(bytes);
  const server = net.createServer((s) => {
    s.on('error', () => {});
    s.resume(); // ignore whatever the client sends
    s.end(data);
  });
  const sha256 = createHash('sha256').update(data).digest('hex');
  return { ...(await listen(server, host)), bytes, sha256, data };
}

/** Accepts connections and never writes (e.g. a proxy that never answers). Input is discarded. */
export async function startSilentServer(host = '127.0.0.1'): Promise<SilentServer> {
  let connections = 0;
  const server = net.createServer((s) => {
    connections++;
    s.on('error', () => {});
    s.resume();
  });
  const base = await listen(server, host);
  return {
    ...base,
    get connections() {
      return connections;
    },
  };
}

/** HTTPS server with the given PEM `cert`/`key` (text, not paths). */
export async function startHttpsServer(
  tls: { cert: string; key: string },
  handler: http.RequestListener,
  host = '127.0.0.1',
): Promise<HttpTestServer> {
  const base = await listen(https.createServer({ cert: tls.cert, key: tls.key }, handler), host);
  return { ...base, url: `https://${hostForUrl(host)}:${base.port}` };
}

/** Plain HTTP server. */
export async function startHttpServer(handler: http.RequestListener, host = '127.0.0.1'): Promise<HttpTestServer> {
  const base = await listen(http.createServer(handler), host);
  return { ...base, url: `http://${hostForUrl(host)}:${base.port}` };
}

function hostForUrl(host: string): string {
  return net.isIPv6(host) ? `[${host}]` : host;
}
