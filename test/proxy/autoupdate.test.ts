/**
 * The Proxy's public answer to upgraders (src/proxy/autoupdate.ts): a flood of asks reaches the Auth Service once
 * per host a cache period, hostile queries get GW_ERR_AUTOUPDATE_QUERY, a slow or unreachable Auth Service gets
 * 503 GW_ERR_AUTOUPDATE_UNAVAILABLE within the deadline, and the cache and the calls in flight stay bounded.
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { AutoupdateEndpoint } from '../../src/proxy/autoupdate.js';
import type { AgentInstruction } from '../../src/wire/autoupdate.js';
import { GatewayError } from '../../src/errors.js';
import { codeOf } from '../helpers/errors.js';

const HOST = '3f1c2b7a-1111-4222-8333-444455556666';
const answer: AgentInstruction = { managed: true, update: true, version: '17.1.0', reason: 'group dev is active', group: 'dev' };
let servers: http.Server[] = [];

afterEach(async () => {
  await Promise.all(servers.map((s) => new Promise((r) => s.close(r))));
  servers = [];
});

describe('AutoupdateEndpoint', () => {
  it('a flood of asks for one host reaches the Auth Service once a cache period', async () => {
    let now = 0;
    const e = new AutoupdateEndpoint({ instruction: async () => answer, clock: () => now });
    const all = await Promise.all(Array.from({ length: 500 }, () => e.answer(`host_id=${HOST}&group=dev`)));
    expect(all.every((a) => a.version === '17.1.0')).toBe(true);
    expect(e.calls).toBe(1);
    now += 2000;
    await e.answer(`host_id=${HOST}&group=dev`);
    expect(e.calls).toBe(2);
  });

  it.each([
    ['no host_id', 'group=dev'],
    ['a host_id that is not a host ID', 'host_id=../../etc/passwd'],
    ['a bad group', `host_id=${HOST}&group=Prod_1`],
    ['an oversized query', `host_id=${HOST}&group=${'a'.repeat(300)}`],
    ['an unknown parameter', `host_id=${HOST}&x=1`],
    ['host_id twice', `host_id=${HOST}&host_id=${HOST}`],
  ])('refuses %s with GW_ERR_AUTOUPDATE_QUERY, asking nobody', async (_what, query) => {
    const e = new AutoupdateEndpoint({ instruction: async () => answer });
    expect(await codeOf(e.answer(query))).toBe('GW_ERR_AUTOUPDATE_QUERY');
    expect(e.calls).toBe(0);
  });

  it('an Auth Service that never answers is 503 at the deadline, and the next ask tries again', async () => {
    const e = new AutoupdateEndpoint({ instruction: () => new Promise<AgentInstruction>(() => undefined), deadlineMs: 50 });
    expect(await codeOf(e.answer(`host_id=${HOST}`))).toBe('GW_ERR_AUTOUPDATE_UNAVAILABLE');
    expect(await codeOf(e.answer(`host_id=${HOST}`))).toBe('GW_ERR_AUTOUPDATE_UNAVAILABLE');
    expect(e.calls).toBe(2);
  });

  it('an Auth Service of an earlier version (no such route) is 404, as an earlier Proxy: the channels apply', async () => {
    const e = new AutoupdateEndpoint({ instruction: async () => Promise.reject(new GatewayError('GW_ERR_API_NOT_FOUND', 'no route GET /v1/autoupdate/instruction')) });
    expect(await codeOf(e.answer(`host_id=${HOST}`))).toBe('GW_ERR_API_NOT_FOUND');
  });

  it('an unreachable Auth Service is 503', async () => {
    const e = new AutoupdateEndpoint({ instruction: async () => Promise.reject(new Error('connect ECONNREFUSED')) });
    expect(await codeOf(e.answer(`host_id=${HOST}`))).toBe('GW_ERR_AUTOUPDATE_UNAVAILABLE');
  });

  it('at most maxInFlight calls wait on the Auth Service; past that, 503 at once', async () => {
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    const e = new AutoupdateEndpoint({ instruction: async () => gate.then(() => answer), maxInFlight: 4 });
    const hosts = Array.from({ length: 6 }, (_, i) => `3f1c2b7a-1111-4222-8333-${String(i).padStart(12, '0')}`);
    const pending = hosts.map((h) => e.answer(`host_id=${h}`).then(() => 'ok', (err: { code: string }) => err.code));
    release();
    expect((await Promise.all(pending)).sort()).toEqual(['GW_ERR_AUTOUPDATE_UNAVAILABLE', 'GW_ERR_AUTOUPDATE_UNAVAILABLE', 'ok', 'ok', 'ok', 'ok']);
    expect(e.calls).toBe(4);
  });

  it('the cache holds at most maxEntries hosts', async () => {
    const e = new AutoupdateEndpoint({ instruction: async () => answer, maxEntries: 10 });
    for (let i = 0; i < 50; i++) await e.answer(`host_id=3f1c2b7a-1111-4222-8333-${String(i).padStart(12, '0')}`);
    expect(e.cachedHosts).toBeLessThanOrEqual(10);
  });

  it('over HTTP: 200 with the instruction, 400 and 405 with their codes, other paths are not its own', async () => {
    const e = new AutoupdateEndpoint({ instruction: async (hostId, group) => ({ ...answer, reason: `${hostId} ${group ?? ''}` }) });
    const server = http.createServer((req, res) => {
      if (!e.handle(req, res)) res.writeHead(404).end();
    });
    servers.push(server);
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    const ok = await fetch(`${base}/v1/webapi/autoupdate/agent?host_id=${HOST}&group=dev`);
    expect(ok.status).toBe(200);
    expect(await ok.json()).toMatchObject({ managed: true, reason: `${HOST} dev` });
    const bad = await fetch(`${base}/v1/webapi/autoupdate/agent?host_id=nope`);
    expect(bad.status).toBe(400);
    expect(((await bad.json()) as { error: { code: string } }).error.code).toBe('GW_ERR_AUTOUPDATE_QUERY');
    expect((await fetch(`${base}/v1/webapi/autoupdate/agent?host_id=${HOST}`, { method: 'POST' })).status).toBe(405);
    expect((await fetch(`${base}/v1/webapi/autoupdate/other`)).status).toBe(404);
  });
});
