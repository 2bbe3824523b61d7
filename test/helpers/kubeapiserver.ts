/**
 * A stand-in Kubernetes API server for tests, driven by the real kubectl (test/helpers/kubeapiserver.test.ts):
 * it checks what a real kube-apiserver checks on the requests the gateway forwards, so a test can show that the
 * gateway's impersonation decides what a user may do.
 *
 * What it checks, as the real one does: HTTPS with a CA the test made (makeTestPki); authentication by client
 * certificate (CN = user, O = groups) or bearer token (a token table the test passes), else 401 with the Status
 * the real server sends; Impersonate-User / -Group / -Uid / -Extra-* each needing the `impersonate` verb on
 * users / groups / serviceaccounts / uids / userextras for that name (403 with the real message otherwise); then
 * every request authorized as the (impersonated) user against RBAC rules, with the real subresource verbs:
 * pods/exec and pods/portforward `create` (SPDY's POST; a WebSocket's GET needs `get` and also `create`, as
 * 1.35's AuthorizePodWebsocketUpgradeCreatePermission requires), pods/log `get`. It serves discovery, pods, exec
 * (WebSocket v5/v4 channels and SPDY/3.1), port-forward (SPDY tunnelled in a WebSocket, and plain SPDY) to a TCP
 * server the test runs, and `logs -f` as a chunked stream.
 *
 * A few objects can be stored for the Kubernetes updater (`objects`, by path: test/helpers/kubeapi/objects.ts): GET
 * answers them and PATCH applies a merge or strategic-merge patch to them, after the same authorization.
 *
 * What it is NOT: no etcd (nothing else is stored; other writes answer 405), no scheduler, no kubelet or container runtime
 * (exec runs the command on this machine, in a temp directory), a handful of resources (namespaces in discovery,
 * pods, their exec / log / portforward), no aggregated discovery or OpenAPI (404; kubectl falls back), no watch,
 * no admission, RBAC rules passed by the test (setBindings) rather than read from Role and Binding objects, no
 * anonymous user (as --anonymous-auth=false), and one server certificate (its listen IP, `localhost`, and the
 * names the test adds).
 *
 * Bounds, so a hostile client cannot hang a test: request headers over `maxHeaderBytes` get 431 (Node's
 * parser), bodies over `maxBodyBytes` (3 MiB, the real server's) get 413, headers must arrive within 10 s (408), a
 * streaming connection idle for `idleMs` is closed, the connection count is capped. The pieces are in
 * test/helpers/kubeapi/ (rbac, authn, api, exec, websocket, spdy, status).
 */
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { STATUS_CODES, type IncomingMessage, type ServerResponse } from 'node:http';
import https from 'node:https';
import type { AddressInfo, Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Duplex } from 'node:stream';
import { WebSocketServer } from 'ws';
import { CREATED, read, streamLog, type Pod, type PodSpec } from './kubeapi/api.js';
import { identify, type TokenUser } from './kubeapi/authn.js';
import { execOptions } from './kubeapi/exec.js';
import { ObjectStore } from './kubeapi/objects.js';
import { attributesOf, authorize, type Attributes, type Binding, type UserInfo } from './kubeapi/rbac.js';
import { serveSpdyExec, serveSpdyPortForward, type StreamLimits } from './kubeapi/spdy.js';
import { badRequest, failure, forbidden, notFound, TOO_LARGE, type Status } from './kubeapi/status.js';
import { pickProtocol, serveWsExec, serveWsPortForward } from './kubeapi/websocket.js';
import { makeTestPki, type ServerCert, type TestPki } from './tls.js';

export type { Binding, PolicyRule, UserInfo } from './kubeapi/rbac.js';
export type { PodSpec } from './kubeapi/api.js';
export type { TokenUser } from './kubeapi/authn.js';

export interface KubeApiServerOptions {
  /** Bearer token → user (and groups). */
  tokens?: Record<string, TokenUser>;
  /** RBAC: who may do what (replace later with setBindings). */
  bindings?: Binding[];
  /** Default: pods `web` and `db` in `default`, container `main`, no ports. */
  pods?: PodSpec[];
  /** Reuse a PKI (its CA signs the server certificate and verifies client certificates); else one is made. */
  pki?: TestPki;
  /** Interval between `logs -f` lines (default 100 ms). */
  logEveryMs?: number;
  streamWaitMs?: number;
  maxStreams?: number;
  maxHeaderBytes?: number;
  maxBodyBytes?: number;
  idleMs?: number;
  /** A request's headers must all arrive within this (default 10 s). */
  headersTimeoutMs?: number;
  /** Address to listen on (default 127.0.0.1; `url` names it). */
  host?: string;
  /** DNS names of the server certificate besides `localhost` (e.g. a name only squid resolves); its IP is `host`. */
  serverNames?: string[];
  /** Objects kept by path (e.g. /apis/apps/v1/namespaces/gw/statefulsets/agent): GET and PATCH them (objects.ts). */
  objects?: Record<string, object>;
}

/** One request as the server decided it (for assertions: who the server thinks asked, and the answer). */
export interface Seen {
  method: string;
  path: string;
  user?: UserInfo;
  impersonatedBy?: UserInfo;
  code: number;
}

export interface KubeApiServer {
  url: string;
  port: number;
  caPem: string;
  pki: TestPki;
  /** Where each pod's exec runs (one directory per pod name). */
  workDir: string;
  seen: Seen[];
  setBindings(bindings: Binding[]): void;
  /** The stored objects (options.objects) as they are now. */
  objects: ObjectStore;
  /** Replaces the token table (a rotated service-account token: the old one is refused from then on). */
  setTokens(tokens: Record<string, TokenUser>): void;
  /** How many `logs -f` streams are still writing (0 once every client has gone). */
  openLogStreams(): number;
  /** A client certificate this server accepts: CN = user, O = groups. */
  clientCert(user: string, groups?: string[]): Promise<ServerCert>;
  /** Writes a kubeconfig for this server (token or client certificate) and returns its path. */
  kubeconfig(auth: { token: string } | { cert: ServerCert }, name?: string): Promise<string>;
  close(): Promise<void>;
}

interface Ctx {
  o: Required<Omit<KubeApiServerOptions, 'pki' | 'tokens' | 'bindings' | 'pods' | 'host' | 'serverNames' | 'objects'>>;
  tokens: Record<string, TokenUser>;
  bindings: Binding[];
  pods: Pod[];
  objects: ObjectStore;
  seen: Seen[];
  workDir: string;
  /** `logs -f` streams still writing. */
  logs: { count: number };
}

/** The subprotocol picked for each WebSocket upgrade (see onUpgrade). */
const chosen = new WeakMap<IncomingMessage, string>();

const UPGRADABLE = /^\/api\/v1\/namespaces\/([^/]+)\/pods\/([^/]+)\/(exec|attach|portforward)$/;

function sendJson(res: ServerResponse, code: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(code, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

function rawReply(socket: Duplex, status: Status): void {
  const code = status.code ?? 500;
  const body = JSON.stringify(status);
  socket.end(`HTTP/1.1 ${code} ${STATUS_CODES[code] ?? ''}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`);
}

type Gate = { ok: true; attrs: Attributes; url: URL } | { ok: false; status: Status };

/** Authentication, impersonation, authorization: the real server's filter chain, in its order. */
function gate(ctx: Ctx, req: IncomingMessage, websocket: boolean): Gate {
  const url = new URL(req.url ?? '/', 'https://standin');
  const seen: Seen = { method: req.method ?? '', path: url.pathname, code: 0 };
  ctx.seen.push(seen);
  const refuse = (status: Status): Gate => { seen.code = status.code ?? 500; return { ok: false, status }; };
  if (ctx.seen.length > 10_000) ctx.seen.splice(0, 1000);
  const who = identify(req, ctx.tokens, ctx.bindings);
  if (!who.ok) return refuse(who.status);
  Object.assign(seen, { user: who.user, ...(who.impersonatedBy ? { impersonatedBy: who.impersonatedBy } : {}) });
  const attrs = attributesOf(who.user, req.method ?? 'GET', url);
  if (!authorize(ctx.bindings, attrs)) return refuse(forbidden(attrs));
  const streaming = ['exec', 'attach', 'portforward'].includes(attrs.subresource);
  if (websocket && streaming && attrs.verb === 'get') {
    const create = { ...attrs, verb: 'create' };
    if (!authorize(ctx.bindings, create)) return refuse(forbidden(create));
  }
  seen.code = 200;
  return { ok: true, attrs, url };
}

function readBody(req: IncomingMessage, max: number, body: string[], done: (tooLarge: boolean) => void): void {
  let n = 0;
  if (Number(req.headers['content-length'] ?? 0) > max) return done(true);
  req.on('data', (d: Buffer) => {
    n += d.length;
    if (n <= max) body.push(d.toString());
    if (n > max) { req.removeAllListeners('data'); req.resume(); done(true); done = () => undefined; }
  });
  req.on('end', () => done(false));
}

function onRequest(ctx: Ctx, req: IncomingMessage, res: ServerResponse): void {
  const g = gate(ctx, req, false);
  if (!g.ok) return sendJson(res, g.status.code ?? 500, g.status);
  if (req.method !== 'GET' && req.method !== 'HEAD') {
    const body: string[] = [];
    return readBody(req, ctx.o.maxBodyBytes, body, (tooLarge) => {
      if (tooLarge) return sendJson(res, 413, TOO_LARGE);
      if (UPGRADABLE.test(g.url.pathname)) return sendJson(res, 400, badRequest('Upgrade request required'));
      if (req.method === 'PATCH' && ctx.objects.has(g.url.pathname)) {
        const a = ctx.objects.patch(g.url.pathname, String(req.headers['content-type'] ?? ''), body.join(''));
        return 'json' in a ? sendJson(res, 200, a.json) : sendJson(res, a.status.code ?? 500, a.status);
      }
      sendJson(res, 405, failure(405, 'MethodNotAllowed', 'the server does not allow this method on the requested resource'));
    });
  }
  if (UPGRADABLE.test(g.url.pathname)) return sendJson(res, 400, badRequest('Upgrade request required'));
  const stored = ctx.objects.get(g.url.pathname);
  if (stored) return sendJson(res, 200, stored);
  const a = read(g.url, String(req.headers.accept ?? ''), ctx.pods);
  if ('status' in a) return sendJson(res, a.status.code ?? 500, a.status);
  if ('json' in a) return sendJson(res, 200, a.json);
  streamLog(req, res, a.pod, g.url, ctx.o.logEveryMs, ctx.logs);
}

function findPod(ctx: Ctx, path: string): { pod: Pod; sub: string } | undefined {
  const m = UPGRADABLE.exec(path);
  const pod = m && ctx.pods.find((p) => p.namespace === m[1] && p.name === m[2]);
  return pod && m ? { pod, sub: m[3]! } : undefined;
}

function onUpgrade(ctx: Ctx, wss: WebSocketServer, req: IncomingMessage, socket: Duplex, head: Buffer): void {
  socket.on('error', () => undefined);
  (socket as Socket).setTimeout(ctx.o.idleMs, () => socket.destroy());
  const websocket = String(req.headers.upgrade ?? '').toLowerCase() === 'websocket';
  const g = gate(ctx, req, websocket);
  if (!g.ok) return rawReply(socket, g.status);
  const found = findPod(ctx, g.url.pathname);
  if (!found) return rawReply(socket, notFound('pods', g.attrs.name));
  if (found.sub === 'attach') return rawReply(socket, badRequest('attach is not served by the stand-in'));
  const { pod, sub } = found;
  const ex = execOptions(g.url);
  if (sub === 'exec' && ex.container !== null && !pod.containers.includes(ex.container)) {
    return rawReply(socket, badRequest(`container ${ex.container} is not valid for pod ${pod.name}`));
  }
  const limits: StreamLimits = { streamWaitMs: ctx.o.streamWaitMs, maxStreams: ctx.o.maxStreams };
  const cwd = join(ctx.workDir, pod.name);
  if (websocket) {
    const offered = new Set(String(req.headers['sec-websocket-protocol'] ?? '').split(',').map((s) => s.trim()).filter(Boolean));
    const protocol = pickProtocol(offered, g.url.pathname);
    if (protocol === false) return rawReply(socket, badRequest(`no supported subprotocol among ${[...offered].join(', ')}`));
    // ws refuses "SPDY/3.1+portforward.k8s.io" as a header token ('/' is no tchar; Go's servers take it): it is
    // handed a token, and handleProtocols answers with the protocol chosen here.
    req.headers['sec-websocket-protocol'] = 'chosen';
    chosen.set(req, protocol);
    return wss.handleUpgrade(req, socket, head, (ws) => {
      if (sub === 'portforward') serveWsPortForward(ws, pod, limits);
      else serveWsExec(ws, { ...ex, cwd });
    });
  }
  if (String(req.headers.upgrade ?? '').toLowerCase() !== 'spdy/3.1') return rawReply(socket, badRequest('unsupported upgrade'));
  const offered = String(req.headers['x-stream-protocol-version'] ?? '').split(',').map((s) => s.trim());
  const proto = sub === 'portforward' ? 'portforward.k8s.io' : 'v4.channel.k8s.io';
  if (!offered.includes(proto)) return rawReply(socket, failure(403, 'Forbidden', `unable to upgrade: no supported stream protocol among ${offered.join(', ')}`));
  socket.write(`HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: ${proto}\r\n\r\n`);
  if (head.length > 0) socket.unshift(head);
  if (sub === 'portforward') serveSpdyPortForward(socket, pod, limits);
  else serveSpdyExec(socket, { ...ex, cwd }, limits);
}

function kubeconfigText(url: string, caPem: string, auth: { token: string } | { cert: ServerCert }, name: string): string {
  const b64 = (s: string) => Buffer.from(s).toString('base64');
  const user = 'token' in auth ? `    token: ${auth.token}` : `    client-certificate-data: ${b64(auth.cert.certPem)}\n    client-key-data: ${b64(auth.cert.keyPem)}`;
  return `apiVersion: v1\nkind: Config\nclusters:\n- name: standin\n  cluster:\n    server: ${url}\n    certificate-authority-data: ${b64(caPem)}\n` +
    `users:\n- name: ${name}\n  user:\n${user}\ncontexts:\n- name: standin\n  context:\n    cluster: standin\n    user: ${name}\n    namespace: default\ncurrent-context: standin\n`;
}

export async function startKubeApiServer(options: KubeApiServerOptions = {}): Promise<KubeApiServer> {
  const pki = options.pki ?? (await makeTestPki());
  const host = options.host ?? '127.0.0.1';
  const cert = await pki.serverCert({ names: [...(options.serverNames ?? []), 'localhost'], ips: [host] });
  const workDir = await mkdtemp(join(tmpdir(), 'gw-kubeapi-'));
  const pods: Pod[] = (options.pods ?? [{ name: 'web' }, { name: 'db' }]).map((p) => ({ name: p.name, namespace: p.namespace ?? 'default', containers: p.containers ?? ['main'], ports: p.ports ?? {}, created: CREATED }));
  for (const p of pods) await mkdir(join(workDir, p.name), { recursive: true });
  const ctx: Ctx = {
    o: {
      logEveryMs: options.logEveryMs ?? 100, streamWaitMs: options.streamWaitMs ?? 30_000, maxStreams: options.maxStreams ?? 100,
      maxHeaderBytes: options.maxHeaderBytes ?? 16 * 1024, maxBodyBytes: options.maxBodyBytes ?? 3 * 1024 * 1024, idleMs: options.idleMs ?? 300_000,
      headersTimeoutMs: options.headersTimeoutMs ?? 10_000,
    },
    tokens: options.tokens ?? {}, bindings: options.bindings ?? [], pods, objects: new ObjectStore(options.objects), seen: [], workDir, logs: { count: 0 },
  };
  const server = https.createServer({
    key: cert.keyPem, cert: cert.certPem, ca: pki.caPem, requestCert: true, rejectUnauthorized: false,
    // Node checks the deadlines every connectionsCheckingInterval (30 s by default): checked every 250 ms here.
    maxHeaderSize: ctx.o.maxHeaderBytes, headersTimeout: ctx.o.headersTimeoutMs, requestTimeout: 60_000, connectionsCheckingInterval: 250,
  }, (req, res) => onRequest(ctx, req, res));
  server.maxConnections = 256;
  const wss = new WebSocketServer({ noServer: true, maxPayload: 1024 * 1024, handleProtocols: (_offered, req) => chosen.get(req) ?? false });
  server.on('upgrade', (req: IncomingMessage, socket: Duplex, head: Buffer) => onUpgrade(ctx, wss, req, socket, head));
  const sockets = new Set<Socket>();
  server.on('secureConnection', (s: Socket) => { sockets.add(s); s.once('close', () => sockets.delete(s)); });
  await new Promise<void>((resolve) => server.listen(0, host, resolve));
  const port = (server.address() as AddressInfo).port;
  const url = `https://${host}:${port}`;
  return {
    url, port, caPem: pki.caPem, pki, workDir, seen: ctx.seen, objects: ctx.objects,
    setBindings: (b) => { ctx.bindings = b; },
    setTokens: (t) => { ctx.tokens = t; },
    openLogStreams: () => ctx.logs.count,
    clientCert: (user, groups = []) => pki.clientCert({ cn: user, organizations: groups }),
    kubeconfig: async (auth, name = 'user') => {
      const path = join(workDir, `kubeconfig-${name}-${Math.random().toString(36).slice(2)}`);
      await writeFile(path, kubeconfigText(url, pki.caPem, auth, name), { mode: 0o600 });
      return path;
    },
    close: async () => {
      for (const c of wss.clients) c.terminate();
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
      await rm(workDir, { recursive: true, force: true });
      if (!options.pki) await pki.cleanup();
    },
  };
}
