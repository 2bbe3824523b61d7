/**
 * The health endpoints (gateway.diag_addr) a supervisor probes, Kubernetes' liveness and readiness above all:
 *   GET /healthz  200 {"status":"ok"} while the process's event loop answers (liveness);
 *   GET /readyz   200 {"status":"ready","checks":[...]} when every readiness check passed, else 503
 *                 {"status":"not ready","checks":[{name, ok, detail, since}, ...]} (readiness: the pod is not
 *                 counted as serving). The checks are the role's (src/roles/health.ts), run on a schedule by
 *                 src/net/health.ts: this answer reads their last results and runs nothing.
 *   GET /metrics  the process's metrics (src/metrics/) in Prometheus's text format, from prom-client, whose
 *                 default process metrics start with this listener (docs/operations.md, "Metrics").
 * Nothing else is served (404; any method but GET and HEAD: 405), no credential is asked for and none is
 * shown: the answers say only whether the process is up. Every connection gets short deadlines (a probe is one
 * small request) and the server caps its connections, so a slow or flooding peer cannot hold it.
 * Node's http server is enough here: a handful of fixed answers, no parsing of our own.
 */
import http from 'node:http';
import type { HostPort } from '../addr.js';
import type { ReadyReport } from './health.js';
import { httpStatus, type ErrorCode } from '../errors.js';
import { registry } from '../metrics/registry.js';
import { startProcessMetrics } from '../metrics/process.js';
import { closeServer, listenOn } from './listen.js';

export interface DiagServer {
  /** host:port bound. */
  address: string;
  close(): Promise<void>;
}

/** Small on purpose: a probe sends one short request. */
const LIMITS = { headersTimeoutMs: 5_000, requestTimeoutMs: 5_000, idleMs: 5_000, maxConnections: 32, maxHeaderSize: 8 * 1024 };

export async function startDiagServer(at: HostPort, ready: () => ReadyReport): Promise<DiagServer> {
  startProcessMetrics();
  const server = http.createServer({ maxHeaderSize: LIMITS.maxHeaderSize, requestTimeout: LIMITS.requestTimeoutMs, connectionsCheckingInterval: 1_000 }, (req, res) => {
    const path = (req.url ?? '/').split('?')[0];
    const send = (status: number, body: object) => {
      const text = JSON.stringify(body);
      res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text), 'cache-control': 'no-store', connection: 'close' });
      res.end(req.method === 'HEAD' ? undefined : text);
    };
    req.resume();
    if (path !== '/healthz' && path !== '/readyz' && path !== '/metrics') return send(404, { status: 'not found', paths: ['/healthz', '/readyz', '/metrics'] });
    if (req.method !== 'GET' && req.method !== 'HEAD') return send(405, { status: 'method not allowed' });
    if (path === '/metrics') return void sendMetrics(req, res);
    if (path === '/healthz') return send(200, { status: 'ok' });
    const r = ready();
    return send(r.status === 'ready' ? 200 : 503, { status: r.status, checks: r.checks });
  });
  server.headersTimeout = LIMITS.headersTimeoutMs;
  server.keepAliveTimeout = LIMITS.idleMs;
  server.timeout = LIMITS.idleMs;
  server.maxConnections = LIMITS.maxConnections;
  const address = await listenOn(server, at, 'gateway.diag_addr');
  return { address, close: () => closeServer(server) };
}

/** The registry in Prometheus's text format (prom-client renders it; its content type names the format's version). */
async function sendMetrics(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
  let body: string;
  try {
    body = await registry.metrics();
  } catch {
    // A collector that threw: a bug of ours, said with the stable code of one (nothing of the failure is shown).
    const text = JSON.stringify({ status: 'error', code: 'GW_ERR_INTERNAL' satisfies ErrorCode });
    res.writeHead(httpStatus('GW_ERR_INTERNAL'), { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text), connection: 'close' });
    res.end(req.method === 'HEAD' ? undefined : text);
    return;
  }
  res.writeHead(200, { 'content-type': registry.contentType, 'content-length': Buffer.byteLength(body), 'cache-control': 'no-store', connection: 'close' });
  res.end(req.method === 'HEAD' ? undefined : body);
}
