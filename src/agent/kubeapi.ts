/**
 * The Kubernetes Service's side of a request the Proxy forwards, when the cluster needs a credential
 * (src/agent/kubecreds.ts): the tunnel's stream is served as HTTP/1.1 here, and each request is sent on to the
 * API server over its own TLS connection with the agent's Authorization header (any the stream carried is
 * dropped: only the agent's credential reaches the API server) and, for a client certificate, the agent's
 * certificate in the TLS handshake. The Proxy's Impersonate-* headers pass through untouched: the Proxy set them
 * from the user's roles and removed any the client sent (src/proxy/webapps.ts).
 * An end-to-end kube stream (kubeFront's `e2e`: the grant's kube_access, src/agent/e2estream.ts) is the user's own
 * kubectl talking through `gwsh proxy kube`, not the Proxy: each request must be under /k8s/<the grant's cluster>/
 * (the prefix is taken off, as the Proxy's kube route does; anything else is 404), and the agent itself removes
 * every Impersonate-* header and sets Impersonate-User/-Group from the grant, the client's own only picking among
 * what the grant allows (src/wire/kubeimpersonate.ts, the Proxy's rule); a refusal is a Kubernetes Status (403
 * GW_ERR_KUBE_NO_IMPERSONATION), nothing sent to the API server.
 * A 401 from the API server makes the next request re-read the token (a rotation the file's stat missed); the
 * 401 itself is passed to the client, never retried with a body the agent would have to hold.
 * A credential that cannot be read answers the request with GW_ERR_KUBE_CREDENTIALS (or
 * GW_ERR_KUBE_AUTH_UNSUPPORTED) as JSON, before anything is sent to the API server.
 * An upgrade (kubectl exec, attach, port-forward: WebSocket or SPDY/3.1) goes the same way, with the agent's
 * credential, and its Upgrade and Connection headers kept: the API server's 101 is relayed and both ways spliced by
 * src/net/upgrade.ts (the Proxy's relay too); any other answer is relayed as a plain one. The API server has
 * UPGRADE_ANSWER_MS for its 101; the upgraded connection has no idle deadline here: the Proxy's idle_timeout
 * closes the tunnel's stream, and the splice then resets the API server's connection.
 */
import http from 'node:http';
import type { Duplex } from 'node:stream';
import { httpStatus, toGatewayError } from '../errors.js';
import { guardHttpServer } from '../net/http.js';
import { protocolsOf, relayUpgrade } from '../net/upgrade.js';
import { duplexPair } from '../stream/pair.js';
import { GatewayError } from '../errors.js';
import { impersonate, kubePathOf, kubeStatus, type KubeAccess } from '../wire/kubeimpersonate.js';
import type { KubeCredentials, KubeTls } from './kubecreds.js';

/** An end-to-end kube stream's grant: the cluster it is for, the user, whom the user may act as. */
export interface KubeE2E {
  cluster: string;
  user: string;
  access: KubeAccess;
}

/** Headers the agent never forwards from the stream: its own credential replaces them. */
const DROPPED = new Set(['authorization', 'proxy-authorization', 'connection', 'keep-alive', 'transfer-encoding', 'upgrade']);

/** The Proxy's requests arrive over its own deadlines; these bound a stream that sends a head slowly or never. */
const DEADLINES = { headerMs: 30_000, requestMs: 60_000, idleMs: 0 };
/** How long the API server has to answer an upgrade: below the Proxy's default header_timeout, so that its 504 names the agent's side. */
const UPGRADE_ANSWER_MS = 20_000;

/** The request's headers as the API server gets them: the client's credential dropped, the agent's added. */
function forwardedHeaders(req: http.IncomingMessage, authorization: string | undefined): http.OutgoingHttpHeaders {
  const headers: http.OutgoingHttpHeaders = {};
  for (const [k, v] of Object.entries(req.headers)) if (!DROPPED.has(k) && v !== undefined) headers[k] = v;
  if (authorization) headers.authorization = authorization;
  return headers;
}

/** A connection to the API server for Node's HTTP client, opened with the agent's TLS material. */
function connector(connect: (tls: KubeTls) => Promise<Duplex>, tls: KubeTls) {
  return (_opts: unknown, done: (err: Error | null, s?: Duplex) => void) => {
    connect(tls).then((s) => done(null, s), (err: Error) => done(err));
    return undefined;
  };
}

function sendError(res: http.ServerResponse, err: unknown, e2e?: KubeE2E): void {
  const e = toGatewayError(err);
  if (res.headersSent) {
    res.destroy();
    return;
  }
  // To kubectl itself (end to end) a Kubernetes Status it prints; to the Proxy the gateway's error, which it relays.
  const body = JSON.stringify(e2e ? kubeStatus(e) : { error: e.toJSON() });
  res.writeHead(httpStatus(e.code), { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
  res.end(body);
}

/**
 * The stream handed to the tunnel for one forwarded Kubernetes connection; connect opens a TLS connection to
 * the API server with the given TLS material (CA, client certificate). upgradeAnswerMs: how long the API server
 * has to answer an upgrade (UPGRADE_ANSWER_MS; tests shorten it).
 */
export function kubeFront(creds: KubeCredentials, connect: (tls: KubeTls) => Promise<Duplex>, options: { upgradeAnswerMs?: number; e2e?: KubeE2E } = {}): Duplex {
  const [outer, inner] = duplexPair();
  const { e2e } = options;
  const server = http.createServer((req, res) => {
    let authorization: string | undefined;
    let tls: KubeTls;
    let as: Asked;
    try {
      as = asWhom(req, e2e);
      authorization = creds.authorization();
      tls = creds.tls();
    } catch (err) {
      req.resume();
      sendError(res, err, e2e);
      return;
    }
    const headers = { ...forwardedHeaders(req, authorization), ...as.headers };
    headers.connection = 'close';
    const upstream = http.request({
      method: req.method,
      path: as.path,
      headers,
      createConnection: connector(connect, tls),
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
    upstream.on('error', (err) => sendError(res, err, e2e));
    res.once('close', () => upstream.destroy());
    req.pipe(upstream);
  });
  server.on('upgrade', (req: http.IncomingMessage, socket: Duplex, head: Buffer) => upgrade(creds, connect, req, socket, head, options.upgradeAnswerMs ?? UPGRADE_ANSWER_MS, e2e));
  guardHttpServer(server, DEADLINES, { upgrades: true })(inner);
  return outer;
}

/** The path and impersonation of a request: as it came from the Proxy, or decided here for an end-to-end stream. */
interface Asked {
  path: string | undefined;
  headers: http.OutgoingHttpHeaders;
}

/** An end-to-end stream's request: its /k8s/<cluster> prefix taken off, the client's Impersonate-* replaced (throws when refused). */
function asWhom(req: http.IncomingMessage, e2e: KubeE2E | undefined): Asked {
  if (!e2e) return { path: req.url, headers: {} };
  const parsed = kubePathOf(req.url ?? '/');
  if (!parsed || parsed.cluster !== e2e.cluster) {
    throw new GatewayError('GW_ERR_API_NOT_FOUND', `this end-to-end stream takes Kubernetes requests under /k8s/${encodeURIComponent(e2e.cluster)}/ only`, {
      hint: `Point kubectl at the server 'gwsh proxy kube ${e2e.cluster}' prints.`,
    });
  }
  return { path: parsed.path, headers: impersonate(req, e2e.access, e2e.user).headers };
}

/** An upgrade request from the Proxy (or kubectl, end to end): to the API server with the agent's credential, its answer relayed. */
function upgrade(creds: KubeCredentials, connect: (tls: KubeTls) => Promise<Duplex>, req: http.IncomingMessage, socket: Duplex, head: Buffer, answerMs: number, e2e: KubeE2E | undefined): void {
  socket.on('error', () => socket.destroy());
  let authorization: string | undefined;
  let tls: KubeTls;
  let as: Asked;
  try {
    as = asWhom(req, e2e);
    authorization = creds.authorization();
    tls = creds.tls();
  } catch (err) {
    refuse(socket, err, e2e);
    return;
  }
  const asked = protocolsOf(req.headers.upgrade);
  const headers = { ...forwardedHeaders(req, authorization), ...as.headers };
  Object.assign(headers, { connection: 'Upgrade', upgrade: req.headers.upgrade });
  const upstream = http.request({ method: req.method, path: as.path, headers, createConnection: connector(connect, tls) } as http.RequestOptions);
  relayUpgrade(upstream, socket, head, asked, {
    headerMs: answerMs,
    idleMs: 0,
    peer: 'the API server',
    codes: { timeout: 'GW_ERR_KUBE_UPGRADE_TIMEOUT', unasked: 'GW_ERR_KUBE_UPGRADE_UNASKED' },
    onAnswer: (answer) => {
      if (answer.statusCode === 401) creds.rejected();
    },
  }).catch((err: unknown) => refuse(socket, err, e2e));
}

/** An upgrade refused before anything was relayed: the error as JSON with its status, then the close. */
function refuse(socket: Duplex, err: unknown, e2e?: KubeE2E): void {
  const e = toGatewayError(err);
  const body = JSON.stringify(e2e ? kubeStatus(e) : { error: e.toJSON() });
  if (!socket.destroyed) socket.end(`HTTP/1.1 ${httpStatus(e.code)} Refused\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`);
}
