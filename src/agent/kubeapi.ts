/**
 * The Kubernetes Service's side of a request the Proxy forwards, when the cluster needs a credential
 * (src/agent/kubecreds.ts): the tunnel's stream is served as HTTP/1.1 here, and each request is sent on to the
 * API server over its own TLS connection with the agent's Authorization header (any the stream carried is
 * dropped: only the agent's credential reaches the API server) and, for a client certificate, the agent's
 * certificate in the TLS handshake. The Proxy's Impersonate-* headers pass through untouched: the Proxy set them
 * from the user's roles and removed any the client sent (src/proxy/webapps.ts).
 * A 401 from the API server makes the next request re-read the token (a rotation the file's stat missed); the
 * 401 itself is passed to the client, never retried with a body the agent would have to hold.
 * A credential that cannot be read answers the request with GW_ERR_KUBE_CREDENTIALS (or
 * GW_ERR_KUBE_AUTH_UNSUPPORTED) as JSON, before anything is sent to the API server.
 * Upgrades (kubectl exec/attach/port-forward) are not served yet: the Proxy does not forward them either.
 */
import http from 'node:http';
import type { Duplex } from 'node:stream';
import { httpStatus, toGatewayError } from '../errors.js';
import { guardHttpServer } from '../net/http.js';
import { duplexPair } from '../stream/pair.js';
import type { KubeCredentials, KubeTls } from './kubecreds.js';

/** Headers the agent never forwards from the stream: its own credential replaces them. */
const DROPPED = new Set(['authorization', 'proxy-authorization', 'connection', 'keep-alive', 'transfer-encoding', 'upgrade']);

/** The Proxy's requests arrive over its own deadlines; these bound a stream that sends a head slowly or never. */
const DEADLINES = { headerMs: 30_000, requestMs: 60_000, idleMs: 0 };

function sendError(res: http.ServerResponse, err: unknown): void {
  const e = toGatewayError(err);
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const body = JSON.stringify({ error: e.toJSON() });
  res.writeHead(httpStatus(e.code), { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
  res.end(body);
}

/**
 * The stream handed to the tunnel for one forwarded Kubernetes connection; connect opens a TLS connection to
 * the API server with the given TLS material (CA, client certificate).
 */
export function kubeFront(creds: KubeCredentials, connect: (tls: KubeTls) => Promise<Duplex>): Duplex {
  const [outer, inner] = duplexPair();
  const server = http.createServer((req, res) => {
    let authorization: string | undefined;
    let tls: KubeTls;
    try {
      authorization = creds.authorization();
      tls = creds.tls();
    } catch (err) {
      req.resume();
      sendError(res, err);
      return;
    }
    const headers: http.OutgoingHttpHeaders = {};
    for (const [k, v] of Object.entries(req.headers)) if (!DROPPED.has(k) && v !== undefined) headers[k] = v;
    if (authorization) headers.authorization = authorization;
    headers.connection = 'close';
    const upstream = http.request({
      method: req.method,
      path: req.url,
      headers,
      createConnection: (_opts: unknown, done: (err: Error | null, s?: Duplex) => void) => {
        connect(tls).then((s) => done(null, s), (err: Error) => done(err));
        return undefined;
      },
    } as http.RequestOptions);
    upstream.on('response', (answer) => {
      if (answer.statusCode === 401) creds.rejected();
      const out: http.OutgoingHttpHeaders = {};
      for (const [k, v] of Object.entries(answer.headers)) if (!DROPPED.has(k) && v !== undefined) out[k] = v;
      res.writeHead(answer.statusCode ?? 502, out);
      answer.pipe(res);
      answer.once('close', () => {
        if (!answer.complete) res.destroy();
      });
    });
    upstream.on('error', (err) => sendError(res, err));
    res.once('close', () => upstream.destroy());
    req.pipe(upstream);
  });
  guardHttpServer(server, DEADLINES)(inner);
  return outer;
}
