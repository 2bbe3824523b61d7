/**
 * Web sessions with two Auth Services on one real PostgreSQL (high availability): a load balancer may send the
 * browser's requests to either, so a session made by one works at the other, a sign-out or a lock at one counts
 * at the other at once, and the one-time things (the bearer handout after SSO, an app launch token) are one-time
 * across both, under concurrent requests.
 */
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openPostgresBackend, type Backend } from '../../src/backend/index.js';
import { AuthService } from '../../src/auth/service.js';
import { createLogger, setRootLogger } from '../../src/log.js';
import { startPostgres, type PostgresServer } from '../helpers/databases.js';
import { rootSuite } from '../helpers/root.js';

/** The launch nonce an app's host set in the browser (a launch token is bound to it). */
const NONCE = 'n'.repeat(43);

const PASSWORD = 'correct horse battery';
const CLUSTER = 'pg-web.example';

let pg: PostgresServer;
const backends: Backend[] = [];
let a: AuthService;
let b: AuthService;

rootSuite(['dbUsers'])('web sessions on PostgreSQL shared by two Auth Services', () => {
  beforeAll(async () => {
    setRootLogger(createLogger({ level: 'silent' }));
    pg = await startPostgres({ port: await getPort({ host: '127.0.0.1' }) });
    for (let i = 0; i < 2; i++) backends.push(await openPostgresBackend({ connString: pg.url(), sweepIntervalMs: 0 }));
    a = await AuthService.open({ backend: backends[0]!, clusterName: CLUSTER });
    b = await AuthService.open({ backend: backends[1]!, clusterName: CLUSTER });
    await a.addUser(a.adminIdentity(), 'alice', ['access', 'editor'], PASSWORD, ['alice']);
  }, 120_000);

  afterAll(async () => {
    for (const backend of backends) await backend.close();
    await pg?.stop();
  });

  it('a session made at one Auth Service works at the other; a lock or a sign-out at either counts at both', async () => {
    const s = await a.webLogin('alice', PASSWORD, '192.0.2.1');
    expect((await b.resolveWebSession(s.id, s.bearer)).identity).toMatchObject({ name: 'alice', roles: ['access', 'editor'] });
    const lock = await b.createLock(b.adminIdentity(), { target: { user: 'alice' } });
    await expect(a.resolveWebSession(s.id, s.bearer)).rejects.toMatchObject({ code: 'GW_ERR_ACCESS_LOCKED' });
    await a.removeLocks(a.adminIdentity(), { name: lock.metadata.name });
    expect((await a.resolveWebSession(s.id, s.bearer)).identity.name).toBe('alice');
    await b.deleteWebSession(s.id, s.bearer);
    await expect(a.resolveWebSession(s.id, s.bearer)).rejects.toMatchObject({ code: 'GW_ERR_WEB_SESSION_INVALID' });
  });

  it('the bearer handout after SSO: of concurrent requests at both Auth Services, exactly one gets it', async () => {
    const created = await a.createWebSession({ kind: 'user', name: 'alice', cluster: CLUSTER, roles: ['access'], logins: ['alice'] }, '192.0.2.1', { connector: { kind: 'oidc', name: 'corp' } });
    const results = await Promise.allSettled(Array.from({ length: 8 }, (_, i) => (i % 2 === 0 ? a : b).handoutWebBearer(created.id)));
    const won = results.filter((r): r is PromiseFulfilledResult<Awaited<ReturnType<AuthService['handoutWebBearer']>>> => r.status === 'fulfilled');
    expect(won).toHaveLength(1);
    for (const r of results) if (r.status === 'rejected') expect(r.reason).toMatchObject({ code: 'GW_ERR_WEB_SESSION_INVALID' });
    expect((await b.resolveWebSession(created.id, won[0]!.value.bearer)).identity.name).toBe('alice');
  });

  it('an app launch token redeemed concurrently at both Auth Services gives one app session; it ends with its parent everywhere', async () => {
    const s = await b.webLogin('alice', PASSWORD, '192.0.2.1');
    const { token } = await a.createAppLaunch(s.id, s.bearer, 'grafana', NONCE);
    const results = await Promise.allSettled(Array.from({ length: 8 }, (_, i) => (i % 2 === 0 ? a : b).redeemAppLaunch(token, 'grafana', NONCE)));
    const won = results.filter((r): r is PromiseFulfilledResult<{ sessionId: string; expiresAt: number }> => r.status === 'fulfilled');
    expect(won).toHaveLength(1);
    for (const r of results) if (r.status === 'rejected') expect(r.reason).toMatchObject({ code: 'GW_ERR_WEB_SESSION_INVALID' });
    const app = won[0]!.value;
    expect((await a.resolveAppSession(app.sessionId, 'grafana')).identity.name).toBe('alice');
    await a.deleteWebSession(s.id, s.bearer);
    await expect(b.resolveAppSession(app.sessionId, 'grafana')).rejects.toMatchObject({ code: 'GW_ERR_WEB_SESSION_INVALID' });
  });
});
