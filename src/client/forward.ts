/**
 * The web port's API router of a Proxy in its own process: every request (login, join through the Proxy, gwctl
 * with a user certificate, /webapi/ca) is forwarded to the Auth API over mutual TLS with the Proxy's own
 * certificate, with the client's verified certificate and address in the FORWARDED headers
 * (src/wire/forwarded.ts). The Auth API honours them only from a Proxy and verifies the certificate again; headers of those names that
 * a client sends are dropped here. The browser's Cookie, Authorization and Origin go as they came, with the host
 * it addressed (for the Auth API's Origin check), and the answer's Set-Cookie comes back as it is. HTTP/2
 * pseudo-headers (`:authority`, ...) are never forwarded, either way.
 *
 * The request body is read here first (bounded), so that a request the current Auth Service does not take can
 * go to the next address; the answer is streamed back.
 */
import https from 'node:https';
import type http from 'node:http';
import type { TLSSocket } from 'node:tls';
import { normalizeHost, parseAddr } from '../addr.js';
import { FORWARDED } from '../wire/forwarded.js';
import { DialerAgent } from '../dial/agent.js';
import type { Dialer } from '../dial/dialer.js';
import { GatewayError, httpStatus } from '../errors.js';
import { logger } from '../log.js';
import { clientAddress } from '../stream/meta.js';
import { unreachable, type RemoteProxyAuth } from './remoteauth.js';
import { authServerIdentity } from './api.js';

/** The largest body forwarded: the Auth API's largest (a manifest) and some room; for a client without a verified certificate, the largest a public route takes (login, join: 64 KiB). */
const MAX_FORWARDED_BODY = 1024 * 1024 + 8 * 1024;
const MAX_ANONYMOUS_BODY = 64 * 1024;
/** Headers that belong to one connection, never forwarded (RFC 9110 section 7.6.1), and ours. */
const DROPPED = new Set(['connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'upgrade', 'te', 'trailer', 'host', FORWARDED.marker, FORWARDED.cert, FORWARDED.addr, FORWARDED.host]);

export interface ForwarderOptions {
  remote: RemoteProxyAuth;
  dialer: Dialer;
  /** Deadline for the Auth API's answer head (ms). */
  timeoutMs?: number;
}

export function createAuthForwarder(options: ForwarderOptions): http.RequestListener {
  const log = logger('forward');
  return (req, res) => {
    const fail = (err: GatewayError) => {
      if (res.headersSent) {
        res.destroy();
        return;
      }
      const text = JSON.stringify({ error: err.toJSON() });
      res.writeHead(httpStatus(err.code), { 'content-type': 'application/json', 'cache-control': 'no-store', 'content-length': Buffer.byteLength(text) });
      res.end(text);
    };
    readBounded(req, hasVerifiedCert(req) ? MAX_FORWARDED_BODY : MAX_ANONYMOUS_BODY)
      .then(async (body) => {
        const upstream = options.remote.upstream();
        const headers = forwardedHeaders(req, body.length);
        // From the current address on, the next one only when this one cannot be reached.
        const order = [upstream.address, ...upstream.addresses.filter((a) => a !== upstream.address)];
        let last: unknown;
        for (const address of order) {
          try {
            await forwardTo(address, { ...upstream, dialer: options.dialer, timeoutMs: options.timeoutMs ?? 30_000 }, req, headers, body, res);
            return;
          } catch (err) {
            if (res.headersSent) throw err;
            last = err;
            options.remote.failedOver(address);
          }
        }
        throw unreachable(order, last);
      })
      .catch((err: unknown) => {
        if (err instanceof GatewayError) {
          log.debug({ code: err.code, path: req.url }, 'forward failed');
          fail(err);
        } else {
          log.warn({ err: (err as Error).message, path: req.url }, 'forward failed');
          fail(new GatewayError('GW_ERR_INTERNAL', (err as Error).message));
        }
      });
  };
}

/** Whether this port's TLS verified a client certificate against the cluster's CAs. */
function hasVerifiedCert(req: http.IncomingMessage): boolean {
  const socket = req.socket as TLSSocket;
  return typeof socket.getPeerCertificate === 'function' && socket.authorized === true;
}

async function readBounded(req: http.IncomingMessage, max: number): Promise<Buffer> {
  const declared = Number(req.headers['content-length']);
  if (declared > max) throw new GatewayError('GW_ERR_API_TOO_LARGE', `request body of ${declared} bytes is over ${max}${max === MAX_ANONYMOUS_BODY ? ' (without a client certificate)' : ''}`);
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += (chunk as Buffer).length;
    if (size > max) throw new GatewayError('GW_ERR_API_TOO_LARGE', `request body over ${max} bytes`);
    chunks.push(chunk as Buffer);
  }
  return Buffer.concat(chunks);
}

/** The client's headers without hop-by-hop ones and ours, plus what the Auth API needs to know of the client. */
function forwardedHeaders(req: http.IncomingMessage, bodyLength: number): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  for (const [name, value] of Object.entries(req.headers)) {
    // A name starting with ':' is an HTTP/2 pseudo-header of the client's request (the web port speaks h2).
    if (value === undefined || DROPPED.has(name) || name.startsWith('x-gateway-') || name.startsWith(':')) continue;
    out[name] = value;
  }
  out['content-length'] = String(bodyLength);
  out[FORWARDED.marker] = '1';
  out[FORWARDED.addr] = clientAddress(req.socket).address;
  const host = req.headers.host ?? req.headers[':authority'];
  if (typeof host === 'string' && host.length > 0) out[FORWARDED.host] = host;
  // Only a certificate that this port's TLS verified against the cluster's CAs; the Auth API checks it again.
  if (hasVerifiedCert(req)) {
    const peer = (req.socket as TLSSocket).getPeerCertificate();
    if (peer?.raw) out[FORWARDED.cert] = peer.raw.toString('base64');
  }
  return out;
}

interface Upstream {
  cert: string;
  key: string;
  ca: string;
  dialer: Dialer;
  timeoutMs: number;
}

/** One try: rejects before the answer's head when the address cannot be reached; then streams the answer. */
function forwardTo(address: string, up: Upstream, req: http.IncomingMessage, headers: Record<string, string | string[]>, body: Buffer, res: http.ServerResponse): Promise<void> {
  const { host, port } = parseAddr(address);
  const agent = new DialerAgent(up.dialer);
  return new Promise<void>((resolve, reject) => {
    const upstream = https.request(
      { hostname: normalizeHost(host), port: port ?? 3025, method: req.method, path: req.url ?? '/', headers, agent, ca: up.ca, cert: up.cert, key: up.key, checkServerIdentity: authServerIdentity, timeout: up.timeoutMs },
      (answer) => {
        upstream.setTimeout(0);
        const out: Record<string, string | string[]> = {};
        for (const [name, value] of Object.entries(answer.headers)) if (value !== undefined && !DROPPED.has(name) && !name.startsWith(':')) out[name] = value;
        res.writeHead(answer.statusCode ?? 502, out);
        answer.pipe(res);
        answer.once('end', () => resolve());
        answer.once('error', reject);
        // The client went away (an event stream, a slow answer): end the request upstream too.
        res.once('close', () => {
          if (!answer.complete) upstream.destroy();
          resolve();
        });
      },
    );
    upstream.on('timeout', () => upstream.destroy(new Error(`${address} did not answer within ${up.timeoutMs} ms`)));
    upstream.on('error', reject);
    upstream.on('close', () => agent.destroy());
    upstream.end(body);
  });
}
