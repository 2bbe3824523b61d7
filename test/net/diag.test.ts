/**
 * The health endpoints (src/net/diag.ts) with a real HTTP client: liveness always, readiness as the daemon says,
 * the metrics in Prometheus's format, nothing else served, and hostile peers (a head never finished, a flood of connections, an oversized header)
 * neither hang a probe nor pile up.
 */
import { once } from 'node:events';
import http from 'node:http';
import net from 'node:net';
import { Gauge } from 'prom-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseAddr } from '../../src/addr.js';
import { startDiagServer, type DiagServer } from '../../src/net/diag.js';
import type { ReadyReport } from '../../src/net/health.js';
import { registry } from '../../src/metrics/registry.js';
import { codeOf } from '../helpers/errors.js';

let diag: DiagServer;
const TUNNEL_DOWN = { name: 'tunnel', ok: false, detail: 'no tunnel to a Proxy (reverse tunnel connecting)', since: '2026-01-01T00:00:00.000Z' };
let readiness: ReadyReport = { status: 'not ready', checks: [TUNNEL_DOWN] };
let port: number;

beforeAll(async () => {
  diag = await startDiagServer({ host: '127.0.0.1', port: 0 }, () => readiness);
  port = parseAddr(diag.address).port!;
});
afterAll(() => diag.close());

function getFull(path: string, method = 'GET', headers: Record<string, string> = {}): Promise<{ status: number; body: string; headers: http.IncomingHttpHeaders }> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, path, method, headers, agent: false }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (body += c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body, headers: res.headers }));
    });
    req.on('error', reject);
    req.end();
  });
}

async function get(path: string, method = 'GET', headers: Record<string, string> = {}): Promise<{ status: number; body: string }> {
  const { status, body } = await getFull(path, method, headers);
  return { status, body };
}

describe('gateway.diag_addr', () => {
  it('/healthz is 200 while the process runs; /readyz follows readiness, naming each check and its result', async () => {
    expect(await get('/healthz')).toEqual({ status: 200, body: '{"status":"ok"}' });
    const down = await get('/readyz');
    expect(down.status).toBe(503);
    expect(JSON.parse(down.body)).toEqual({ status: 'not ready', checks: [TUNNEL_DOWN] });
    readiness = { status: 'ready', checks: [{ ...TUNNEL_DOWN, ok: true, detail: '1 Proxy tunnel' }] };
    const up = await get('/readyz?verbose');
    expect(up.status).toBe(200);
    expect(JSON.parse(up.body)).toEqual({ status: 'ready', checks: [{ ...TUNNEL_DOWN, ok: true, detail: '1 Proxy tunnel' }] });
  });

  it('/metrics: the registry in Prometheus text format on GET, its head on HEAD, 405 for any other method', async () => {
    const res = await getFull('/metrics');
    expect(res.status).toBe(200);
    expect(res.headers['content-type']).toBe(registry.contentType);
    // The process's own figures start with the listener.
    expect(res.body).toMatch(/^# TYPE gateway_process_cpu_seconds_total counter$/m);
    expect(res.body).toMatch(/^# TYPE gateway_nodejs_eventloop_lag_seconds gauge$/m);
    const head = await getFull('/metrics', 'HEAD');
    expect([head.status, head.body, head.headers['content-type']]).toEqual([200, '', registry.contentType]);
    expect((await get('/metrics', 'POST')).status).toBe(405);
    expect((await get('/metrics', 'DELETE')).status).toBe(405);
  });

  it('/metrics: a collector that throws is a 500 with GW_ERR_INTERNAL, nothing of the failure shown; the next scrape works', async () => {
    new Gauge({ name: 'gateway_test_broken', help: 'test', registers: [registry], collect: () => { throw new Error('secret detail'); } });
    try {
      expect(await get('/metrics')).toEqual({ status: 500, body: '{"status":"error","code":"GW_ERR_INTERNAL"}' });
    } finally {
      registry.removeSingleMetric('gateway_test_broken');
    }
    expect((await get('/metrics')).status).toBe(200);
  });

  it('serves nothing else: other paths 404, other methods 405', async () => {
    expect((await get('/metrics/../etc/passwd')).status).toBe(404);
    expect((await get('/healthz/../etc/passwd')).status).toBe(404);
    expect((await get('/healthz', 'POST')).status).toBe(405);
  });

  it('hostile: an oversized header is refused, and a flood of idle connections does not stop a probe', async () => {
    expect((await get('/healthz', 'GET', { 'x-big': 'a'.repeat(16 * 1024) })).status).toBe(431);
    const idle: net.Socket[] = [];
    for (let i = 0; i < 20; i++) {
      const s = net.connect(port, '127.0.0.1');
      s.on('error', () => undefined);
      s.write('GET /healthz HTTP/1.1\r\nHost: x\r\n'); // a head never finished
      idle.push(s);
    }
    await Promise.all(idle.map((s) => once(s, 'connect')));
    expect((await get('/healthz')).status).toBe(200);
    // The unfinished heads are closed by the server (its header deadline), not left open.
    await Promise.all(idle.map((s) => once(s, 'close')));
  }, 30_000);

  it('an address already in use is GW_ERR_LISTEN naming gateway.diag_addr', async () => {
    expect(await codeOf(startDiagServer({ host: '127.0.0.1', port }, () => readiness))).toBe('GW_ERR_LISTEN');
  });
});
