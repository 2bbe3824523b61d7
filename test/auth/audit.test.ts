/**
 * The audit log's Proxy events (src/auth/audit.ts): only the session kinds, recorded as the reporting Proxy's,
 * and bounded per Proxy so that a compromised Proxy cannot fill the Backend with 30-day records.
 */
import { describe, expect, it } from 'vitest';
import { AuditLog, PROXY_EVENTS_PER_MINUTE } from '../../src/auth/audit.js';
import { openSqliteBackend } from '../../src/backend/index.js';

describe('AuditLog.recordProxyEvent', () => {
  it('hostile: a Proxy flooding session events is refused beyond PROXY_EVENTS_PER_MINUTE; other Proxies and the Auth Service still record', async () => {
    let now = Date.parse('2026-01-01T00:00:00Z');
    const backend = openSqliteBackend({ path: ':memory:', sweepIntervalMs: 0 });
    const audit = new AuditLog(backend, () => now);
    const event = { event: 'app.session.end', user: 'mallory', resource: 'echo' };
    for (let i = 0; i < PROXY_EVENTS_PER_MINUTE; i++) await audit.recordProxyEvent('rogue', event);
    await expect(audit.recordProxyEvent('rogue', event)).rejects.toMatchObject({ code: 'GW_ERR_AUDIT_RATE_LIMITED' });
    await audit.recordProxyEvent('honest', { event: 'db.session.start', user: 'alice', resource: 'pg' });
    await audit.record('user.login', undefined, { user: 'bob' });
    const all = (await audit.list()).map((e) => e.event);
    expect(all.filter((e) => (e.reported_by as { proxy_id?: string } | undefined)?.proxy_id === 'rogue')).toHaveLength(PROXY_EVENTS_PER_MINUTE);
    expect(all.filter((e) => e.user === 'alice' || e.user === 'bob')).toHaveLength(2);
    // The next minute, the rogue Proxy's window is fresh (a lock of it is what ends it: security.md).
    now += 60_000;
    await audit.recordProxyEvent('rogue', event);
    await backend.close();
  }, 60_000);

  it('hostile: no other kind, and the reporter is the one given (the caller), never the one claimed', async () => {
    const backend = openSqliteBackend({ path: ':memory:', sweepIntervalMs: 0 });
    const audit = new AuditLog(backend, Date.now);
    for (const kind of ['user.login', 'session.start', 'lock.create', 'db.session', '__proto__', 42]) {
      await expect(audit.recordProxyEvent('p1', { event: kind })).rejects.toMatchObject({ code: 'GW_ERR_MEMBER_EVENT_REFUSED' });
    }
    await expect(audit.recordProxyEvent('p1', { event: 'db.session.end', pad: 'x'.repeat(70_000) })).rejects.toMatchObject({ code: 'GW_ERR_API_BAD_REQUEST' });
    await audit.recordProxyEvent('p1', { event: 'kube.session.start', reported_by: { host_id: 'agent-9', nodename: 'x' } });
    expect((await audit.list()).map((e) => e.event)).toEqual([{ event: 'kube.session.start', reported_by: { proxy_id: 'p1' } }]);
    await backend.close();
  });
});
