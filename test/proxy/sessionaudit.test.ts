/**
 * The Proxy's session audit (src/proxy/sessionaudit.ts) with a clock of its own and a report function that keeps
 * what it is given: budgets, coalescing, the bounds, HTTP sessions and the stop. The e2e test
 * (test/e2e/session-audit.test.ts) runs the same through real clients and daemons.
 */
import { PassThrough } from 'node:stream';
import { EventEmitter } from 'node:events';
import { describe, expect, it } from 'vitest';
import { GatewayError } from '../../src/errors.js';
import { HTTP_IDLE_MS, MAX_COALESCED, MAX_HTTP_SESSIONS, MAX_PENDING, SessionAudit, USER_BUDGET } from '../../src/proxy/sessionaudit.js';

type Event = Record<string, unknown>;

function harness(report?: (e: Event) => Promise<void>) {
  let now = Date.parse('2026-01-01T00:00:00Z');
  const written: Event[] = [];
  const audit = new SessionAudit({ proxyId: 'proxy-1', clock: () => now, autoFlush: false, report: report ?? (async (e) => void written.push(e)) });
  return { audit, written, tick: (ms: number) => (now += ms) };
}

const fields = (user: string, resource = 'pg') => ({ user, resource, node: 'agent-1', client: '192.0.2.7:5000' });

describe('SessionAudit', () => {
  it('records a start and an end with the same session id, the bytes, the duration and the error', async () => {
    const { audit, written, tick } = harness();
    const s = audit.start('db', { ...fields('alice'), protocol: 'postgres' }, { defer: true });
    expect(written).toHaveLength(0); // deferred: the start waits for the startup message
    s.learn({ db_user: 'orders', db_name: 'shop' });
    s.count(100, 0);
    tick(1500);
    s.count(0, 4000);
    s.end({ error: 'connection broken' });
    s.end();
    await audit.stop();
    expect(written).toEqual([
      { event: 'db.session.start', session: s.id, ...fields('alice'), protocol: 'postgres', db_user: 'orders', db_name: 'shop', proxy: 'proxy-1', time: '2026-01-01T00:00:00.000Z' },
      {
        event: 'db.session.end', session: s.id, ...fields('alice'), protocol: 'postgres', db_user: 'orders', db_name: 'shop', proxy: 'proxy-1',
        start: '2026-01-01T00:00:00.000Z', duration_ms: 1500, bytes_in: 100, bytes_out: 4000, error: 'connection broken', time: '2026-01-01T00:00:01.500Z',
      },
    ]);
  });

  it('spliced: counts both directions and records a clean end, or an error when a side was destroyed', async () => {
    const { audit, written } = harness();
    const [client, resource] = [new PassThrough(), new PassThrough()];
    const s = audit.start('app', fields('alice', 'echo'));
    audit.spliced(s, client, resource);
    client.end(Buffer.alloc(10));
    resource.end(Buffer.alloc(25));
    client.resume();
    resource.resume();
    await new Promise((r) => setImmediate(r));
    client.destroy();
    resource.destroy();
    const [c2, r2] = [new PassThrough(), new PassThrough()];
    const broken = audit.start('app', fields('alice', 'echo'));
    audit.spliced(broken, c2, r2);
    c2.write(Buffer.alloc(3));
    c2.resume();
    await new Promise((r) => setImmediate(r));
    c2.destroy(new Error('read ECONNRESET'));
    r2.destroy();
    await new Promise((r) => setImmediate(r)); // close events come on the next tick
    await audit.stop();
    const ends = written.filter((e) => e.event === 'app.session.end');
    expect(ends[0]).toMatchObject({ session: s.id, bytes_in: 10, bytes_out: 25 });
    expect(ends[0]!.error).toBeUndefined();
    expect(ends[1]).toMatchObject({ session: broken.id, bytes_in: 3, error: 'client: read ECONNRESET' });
  });

  it('hostile: a user opening and dropping thousands of connections gets USER_BUDGET records a minute and one coalesced record; another user is not affected', async () => {
    const { audit, written, tick } = harness();
    const FLOOD = 5000;
    for (let i = 0; i < FLOOD; i++) {
      const s = audit.start('app', fields('mallory', `app-${i % 50}`));
      s.count(1, 2);
      s.end({ error: 'connection broken' });
    }
    // Mallory's flood spent her budget, not bob's, nor her own budget of another kind.
    const bob = audit.start('app', fields('bob', 'wiki'));
    bob.end();
    const mine = audit.start('db', fields('mallory', 'pg'));
    mine.end();
    tick(60_000);
    audit.flush();
    await audit.stop();
    const mallory = written.filter((e) => e.user === 'mallory' && String(e.event).startsWith('app.'));
    expect(mallory.length).toBe(2 * USER_BUDGET + 1);
    const coalesced = mallory.find((e) => e.coalesced !== undefined)!;
    expect(coalesced).toMatchObject({ event: 'app.session.end', coalesced: FLOOD - USER_BUDGET, errors: FLOOD - USER_BUDGET, bytes_in: FLOOD - USER_BUDGET, bytes_out: 2 * (FLOOD - USER_BUDGET), proxy: 'proxy-1' });
    expect((coalesced.resources as string[]).length).toBeLessThanOrEqual(10);
    expect(written.filter((e) => e.user === 'bob').map((e) => e.event)).toEqual(['app.session.start', 'app.session.end']);
    expect(written.filter((e) => e.user === 'mallory' && String(e.event).startsWith('db.')).map((e) => e.event)).toEqual(['db.session.start', 'db.session.end']);
  });

  it('hostile: thousands of users each under their budget are held by the Proxy-wide budget; coalesced pairs are bounded', async () => {
    const { audit, written } = harness();
    const USERS = 3000;
    for (let i = 0; i < USERS; i++) audit.start('app', fields(`user-${i}`)).end();
    audit.flush();
    await audit.stop();
    const own = written.filter((e) => e.coalesced === undefined);
    const coalesced = written.filter((e) => e.coalesced !== undefined);
    expect(own.length).toBeLessThan(2 * USERS);
    expect(coalesced.length).toBeLessThanOrEqual(MAX_COALESCED + 1);
    // Every session counted once: its own end, or in a coalesced count (user "*" beyond the bound).
    const counted = own.filter((e) => e.event === 'app.session.end').length + coalesced.reduce((n, e) => n + (e.coalesced as number), 0);
    expect(counted).toBe(USERS);
    expect(coalesced.some((e) => e.user === '*')).toBe(true);
  });

  it('hostile: an Auth Service that does not answer holds at most MAX_PENDING reports; the rest is coalesced, not lost', async () => {
    const held: Array<() => void> = [];
    let reported = 0;
    const { audit } = harness(() => new Promise<void>((r) => held.push(() => ((reported += 1), r()))));
    for (let i = 0; i < 3 * MAX_PENDING; i++) audit.start('db', fields(`u-${i}`)).end();
    expect(held.length).toBeLessThanOrEqual(MAX_PENDING + 1);
    const stopping = audit.stop();
    while (held.length > 0) held.shift()!();
    await stopping;
    expect(reported).toBeGreaterThan(0);
  });

  it('HTTP: the requests of one connection are one session, ended when the connection closes', async () => {
    const { audit, written } = harness();
    const connection = Object.assign(new EventEmitter(), { destroyed: false });
    for (let i = 0; i < 5; i++) audit.httpRequest('kube', 'kube:dev', fields('alice', 'dev'), { connection }).count(10, 100);
    audit.httpRequest('kube', 'kube:prod', fields('alice', 'prod'), { connection }).count(1, 1);
    expect(written.map((e) => e.event)).toEqual(['kube.session.start', 'kube.session.start']);
    connection.emit('close');
    await audit.stop();
    const dev = written.find((e) => e.event === 'kube.session.end' && e.resource === 'dev');
    expect(dev).toMatchObject({ requests: 5, bytes_in: 50, bytes_out: 500 });
    expect(dev!.error).toBeUndefined();
  });

  it('HTTP: a Web UI app session (start recorded at the launch) ends after HTTP_IDLE_MS without a request, or when refused', async () => {
    const { audit, written, tick } = harness();
    audit.httpRequest('app', 'app:ref-1', { ...fields('alice', 'grafana'), app_session: 'ref-1' }, { startRecorded: true }).count(5, 50);
    tick(HTTP_IDLE_MS - 1);
    audit.httpRequest('app', 'app:ref-1', { ...fields('alice', 'grafana'), app_session: 'ref-1' }, { startRecorded: true }).count(5, 50);
    audit.httpRequest('app', 'app:ref-2', { ...fields('alice', 'grafana'), app_session: 'ref-2' }, { startRecorded: true });
    audit.endHttp('app:ref-2', { error: 'GW_ERR_WEB_SESSION_EXPIRED' });
    tick(HTTP_IDLE_MS - 1);
    audit.flush();
    expect(written.map((e) => [e.event, e.app_session])).toEqual([['app.session.end', 'ref-2']]);
    tick(1);
    audit.flush();
    await audit.stop();
    expect(written.map((e) => [e.event, e.app_session])).toEqual([['app.session.end', 'ref-2'], ['app.session.end', 'ref-1']]);
    expect(written[0]).toMatchObject({ error: 'GW_ERR_WEB_SESSION_EXPIRED' });
    expect(written[1]).toMatchObject({ requests: 2, bytes_in: 10, bytes_out: 100, duration_ms: HTTP_IDLE_MS - 1 });
  });

  it('HTTP: a Web UI app session whose upgraded connection (a WebSocket) moves bytes is not ended as idle', async () => {
    const { audit, written, tick } = harness();
    audit.httpRequest('app', 'app:ref-ws', { ...fields('alice', 'grafana'), app_session: 'ref-ws' }, { startRecorded: true }).count(5, 50);
    tick(HTTP_IDLE_MS - 1);
    audit.touchHttp('app:ref-ws');
    tick(HTTP_IDLE_MS - 1);
    audit.flush();
    expect(written).toEqual([]);
    tick(1);
    audit.flush();
    expect(written.map((e) => [e.event, e.app_session])).toEqual([['app.session.end', 'ref-ws']]);
  });

  it('hostile: app sessions beyond MAX_HTTP_SESSIONS end the least recently used, so the Proxy does not grow', async () => {
    const { audit, written } = harness();
    for (let i = 0; i <= MAX_HTTP_SESSIONS; i++) audit.httpRequest('app', `app:${i}`, fields(`u${i}`, 'grafana'), { startRecorded: true });
    expect(written.filter((e) => e.event === 'app.session.end')).toHaveLength(1);
    expect(audit.openCount).toBe(MAX_HTTP_SESSIONS);
    await audit.stop();
  });

  it('stop(): every open session ends with "proxy stopping", coalesced ones are written, and the reports are awaited', async () => {
    const { audit, written } = harness();
    const open = audit.start('desktop', fields('alice', 'win-1'));
    open.count(7, 9);
    await audit.stop();
    expect(written.at(-1)).toMatchObject({ event: 'desktop.session.end', session: open.id, error: 'proxy stopping', bytes_in: 7, bytes_out: 9 });
    expect(audit.openCount).toBe(0);
  });
});

describe('SessionAudit and an Auth Service that cannot be reached', () => {
  it('keeps the reports that did not reach it and sends them again, in order, at the next flush; a refusal is not sent again', async () => {
    let reachable = false;
    const written: Event[] = [];
    const tries = new Map<unknown, number>();
    const { audit } = harness(async (e) => {
      tries.set(e.session ?? e.event, (tries.get(e.session ?? e.event) ?? 0) + 1);
      if (e.resource === 'refused') throw new GatewayError('GW_ERR_API_BAD_REQUEST', 'no');
      if (!reachable) throw new GatewayError('GW_ERR_AUTH_UNREACHABLE', 'no Auth Service answers');
      written.push(e);
    });
    const s = audit.start('db', fields('alice', 'pg'));
    s.end({ error: 'connection broken' });
    const refused = audit.start('db', fields('alice', 'refused'));
    refused.end();
    await new Promise((r) => setImmediate(r));
    expect(written).toHaveLength(0);
    reachable = true;
    audit.flush();
    await audit.stop();
    expect(written.map((e) => [e.event, e.session])).toEqual([['db.session.start', s.id], ['db.session.end', s.id]]);
    expect(tries.get(refused.id)).toBe(2); // its start and its end, once each
  });
});
