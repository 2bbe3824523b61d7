/**
 * HTTP(S) requests through the Dialer: an http.Agent (built on agent-base, the base of the proxy-agent family)
 * whose connections come from Dialer.dial, so HTTPS calls (the agents' trust connection, forward_url fetches)
 * follow exactly the same proxy selection and give the same errors as every other dial. Requests to http://
 * targets are tunnelled with CONNECT too (documented in docs/dialing.md).
 *
 * A request to a cluster's Proxy (clusterProxy) takes its TLS from src/dial/fallback.ts, which decides whether it
 * goes through the upgrade transport past a TLS-inspecting proxy.
 *
 * A request made without verification (the CA fetch that a pin then checks) can ask for what the server presented
 * and how it was dialled (withPeer), so that an answer that fails the pin can be told apart from an inspecting
 * proxy's (src/client/api.ts fetchPinnedCas).
 */
import http from 'node:http';
import https from 'node:https';
import type { PeerCertificate } from 'node:tls';
import type tls from 'node:tls';
import { Agent, type AgentConnectOpts } from 'agent-base';
import { formatHostPort, normalizeHost } from '../addr.js';
import { GatewayError } from '../errors.js';
import type { Duplex } from 'node:stream';
import { connectTls, presentedChain, type PresentedCert } from '../stream/tls.js';
import { dialRoute, type DialRoute, type Dialer } from './dialer.js';
import { connectClusterTls } from './fallback.js';
import { tlsVerifyError, type TlsPeer } from './tlsverify.js';

/** The Dialer's socket under each TLS socket DialerAgent made, for the route of a response. */
const underlying = new WeakMap<object, Duplex>();

export class DialerAgent extends Agent {
  constructor(
    private readonly dialer: Dialer,
    options: http.AgentOptions = {},
    /** The server is a cluster's Proxy: TLS through fallback.ts (the upgrade past a TLS-inspecting proxy). */
    private readonly cluster?: { peer: Omit<TlsPeer, 'address'> },
  ) {
    super(options);
  }

  override async connect(_req: http.ClientRequest, opts: AgentConnectOpts) {
    const host = normalizeHost(opts.host ?? 'localhost');
    const port = opts.port ?? (opts.secureEndpoint ? 443 : 80);
    if (this.cluster && opts.secureEndpoint) {
      const { host: _h, port: _p, path: _path, ...tlsOpts } = opts as tls.ConnectionOptions & { path?: string };
      const ca = tlsOpts.ca === undefined ? {} : { clusterCa: ([] as Array<string | Buffer>).concat(tlsOpts.ca).map(String) };
      return connectClusterTls(this.dialer, formatHostPort(host, port), { ...tlsOpts, host }, { peer: this.cluster.peer, ...ca });
    }
    const kind = opts.secureEndpoint ? 'https' : 'http';
    const socket = await this.dialer.dial({ kind, host, port, text: `${kind}://${opts.host}:${port}` });
    if (!opts.secureEndpoint) return socket;
    const { host: _h, port: _p, path: _path, ...tlsOpts } = opts as tls.ConnectionOptions & { path?: string };
    const secure = await connectTls(socket, { ...tlsOpts, host });
    underlying.set(secure, socket);
    return secure;
  }
}

export interface FetchOptions {
  dialer: Dialer;
  method?: string;
  headers?: Record<string, string>;
  /** Extra CA (PEM) trusted for the server, e.g. the cluster CA once pinned; or false to skip verification (only for fetching a CA that is then checked against a pin). */
  ca?: string | Buffer | Array<string | Buffer>;
  rejectUnauthorized?: boolean;
  /** Client certificate and key (PEM) for mutual TLS. */
  cert?: string;
  key?: string;
  /** Request body (sent with content-length). */
  body?: string | Buffer;
  timeoutMs?: number;
  /** Largest body accepted; bigger answers are an error rather than unbounded memory. */
  maxBodyBytes?: number;
  signal?: AbortSignal;
  /** Who the server is, for the error when its certificate fails the check (src/dial/tlsverify.ts). */
  tlsPeer?: Omit<TlsPeer, 'address'>;
  /** A check of the server's certificate after the chain (Node's tls option of that name). */
  checkServerIdentity?: (host: string, cert: PeerCertificate) => Error | undefined;
  /** Also return the chain the server presented and the route of the connection (FetchResult.peer). */
  withPeer?: boolean;
  /**
   * The server is a cluster's Proxy verified against the cluster's CA (with tlsPeer): behind a TLS-inspecting
   * proxy whose root the operator gave, the request goes through the upgrade transport (src/dial/fallback.ts).
   */
  clusterProxy?: boolean;
}

/** What an https server presented, and how the connection to it was dialled. */
export interface FetchPeer {
  chain: PresentedCert[];
  route: DialRoute | undefined;
}

export interface FetchResult {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: Buffer;
  /** With withPeer, for an https:// request. */
  peer?: FetchPeer;
}

/** A small HTTPS (or HTTP) request through the Dialer with a deadline and a bounded body. */
export function fetchThroughDialer(url: string, options: FetchOptions): Promise<FetchResult> {
  const maxBody = options.maxBodyBytes ?? 1024 * 1024;
  const timeoutMs = options.timeoutMs ?? 15_000;
  const agent = new DialerAgent(options.dialer, {}, options.clusterProxy && options.tlsPeer ? { peer: options.tlsPeer } : undefined);
  const u = new URL(url);
  return new Promise<FetchResult>((resolve, reject) => {
    const request = u.protocol === 'http:' ? http.request : https.request;
    const req = request(
      {
        protocol: u.protocol,
        hostname: u.hostname,
        port: u.port || undefined,
        path: `${u.pathname}${u.search}`,
        method: options.method ?? 'GET',
        headers: options.headers,
        agent,
        ...(options.ca === undefined ? {} : { ca: options.ca }),
        ...(options.rejectUnauthorized === undefined ? {} : { rejectUnauthorized: options.rejectUnauthorized }),
        ...(options.cert === undefined ? {} : { cert: options.cert, key: options.key }),
        ...(options.signal ? { signal: options.signal } : {}),
        ...(options.checkServerIdentity ? { checkServerIdentity: options.checkServerIdentity } : {}),
        timeout: timeoutMs,
      },
      (res) => {
        const peer = options.withPeer ? peerOf(res.socket) : undefined;
        const chunks: Buffer[] = [];
        let size = 0;
        res.on('data', (chunk: Buffer) => {
          size += chunk.length;
          if (size > maxBody) {
            req.destroy(new GatewayError('GW_ERR_HTTP_TOO_LARGE', `${u.origin}${u.pathname} answered more than ${maxBody} bytes`));
            return;
          }
          chunks.push(chunk);
        });
        res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks), ...(peer ? { peer } : {}) }));
        res.on('error', reject);
      },
    );
    req.on('timeout', () =>
      req.destroy(new GatewayError('GW_ERR_HTTP_TIMEOUT', `${u.origin}${u.pathname} did not answer within ${timeoutMs} ms`)),
    );
    req.on('error', (err) => {
      if (err instanceof GatewayError) return reject(err);
      const address = formatHostPort(normalizeHost(u.hostname), Number(u.port || (u.protocol === 'http:' ? 80 : 443)));
      const tlsError = tlsVerifyError(err, { address, ...(options.tlsPeer ?? { server: 'server' }) });
      reject(tlsError ?? new GatewayError('GW_ERR_HTTP_FAILED', `request to ${u.origin}${u.pathname} failed: ${err.message}`, { cause: err }));
    });
    req.end(options.body);
  }).finally(() => agent.destroy());
}

function peerOf(socket: unknown): FetchPeer | undefined {
  const s = socket as Partial<tls.TLSSocket> | null;
  if (typeof s?.getPeerCertificate !== 'function') return undefined;
  const raw = underlying.get(s);
  return { chain: presentedChain(s.getPeerCertificate(true)), route: raw ? dialRoute(raw) : undefined };
}
