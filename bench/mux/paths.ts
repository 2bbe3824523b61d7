/**
 * bench:mux's path setups: the backend every path ends at (a Node TLS server on BACKEND_IP, ALPN gateway-tcp: SNI
 * sink.gw.test counts bytes, any other name echoes) and the client that opens a TLS stream through a path
 * (direct, the multiplexer, HAProxy) and checks the ALPN it got.
 */
import net from 'node:net';
import tls from 'node:tls';
import { ALPN, BACKEND_IP, NAMES } from './settings.js';

/** One way to the backend: straight, or through a router (whose process is pid). */
export interface Path {
  name: string;
  host: string;
  port: number;
  /** The router's process, for its CPU time; none for direct. */
  pid?: number;
}

export const now = (): number => Number(process.hrtime.bigint()) / 1e6; // ms

/** The TLS echo/sink backend. */
export interface Backend {
  port: number;
  /** Resolves (ms, `now()`) once the sink connection has received `bytes`. */
  sinkReceives(bytes: number): Promise<number>;
  close(): void;
}

export async function startBackend(cert: { keyPem: string; certPem: string }): Promise<Backend> {
  let sinkWaiter: { expected: number; resolve: (t: number) => void } | undefined;
  const backendSockets = new Set<net.Socket>();
  const backend = tls.createServer({ key: cert.keyPem, cert: cert.certPem, ALPNProtocols: [ALPN], noDelay: true }, (s) => {
    s.on('error', () => undefined);
    if (s.servername === NAMES.sink) {
      let got = 0;
      s.on('data', (c: Buffer) => {
        got += c.length;
        if (sinkWaiter && got >= sinkWaiter.expected) {
          const w = sinkWaiter;
          sinkWaiter = undefined;
          w.resolve(now());
        }
      });
    } else {
      s.on('data', (c: Buffer) => s.write(c));
    }
  });
  backend.on('connection', (s: net.Socket) => {
    backendSockets.add(s);
    s.once('close', () => backendSockets.delete(s));
  });
  backend.on('tlsClientError', () => undefined);
  await new Promise<void>((r) => backend.listen({ host: BACKEND_IP, port: 0, backlog: 4096 }, r));
  return {
    port: (backend.address() as net.AddressInfo).port,
    sinkReceives: (bytes) => new Promise<number>((resolve) => (sinkWaiter = { expected: bytes, resolve })),
    close: () => {
      for (const s of backendSockets) s.destroy();
      backend.close();
    },
  };
}

/** The bench's TLS client: streams through a path, with the TLS version and cipher the first one negotiated. */
export interface Client {
  connect(path: Path, servername: string): Promise<tls.TLSSocket>;
  /** A new connection, one echoed byte, closed. */
  connectEchoClose(path: Path): Promise<void>;
  negotiated(): string | undefined;
}

export function makeClient(caPem: string): Client {
  let negotiated: string | undefined;
  const connect = (path: Path, servername: string) =>
    new Promise<tls.TLSSocket>((resolve, reject) => {
      const s = tls.connect({ socket: net.connect({ host: path.host, port: path.port, noDelay: true }), servername, ALPNProtocols: [ALPN], ca: caPem }, () => {
        s.off('error', reject);
        s.on('error', () => undefined);
        if (s.alpnProtocol !== ALPN) {
          s.destroy();
          return reject(new Error(`${path.name}: ALPN ${String(s.alpnProtocol)} negotiated, not ${ALPN}`));
        }
        negotiated ??= `${s.getProtocol() ?? '?'} ${s.getCipher().name}`;
        resolve(s);
      });
      s.once('error', reject);
    });
  const echoOne = (s: tls.TLSSocket) =>
    new Promise<void>((resolve, reject) => {
      s.once('data', () => resolve());
      s.once('close', () => reject(new Error('closed before the echo')));
      s.write('x');
    });
  const connectEchoClose = async (path: Path) => {
    const s = await connect(path, NAMES.echo);
    await echoOne(s);
    s.destroy();
  };
  return { connect, connectEchoClose, negotiated: () => negotiated };
}
