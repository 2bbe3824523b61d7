/**
 * The agent's side of host certificate renewal (src/agent/renewal.ts): when it is due, what it accepts, what it
 * stores, and the tunnel's renews in flight. The certificates come from a real Auth Service (SQLite in memory);
 * the hostile answers are real certificates of the wrong host, key or CA.
 */
import { createPublicKey } from 'node:crypto';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { loadHostIdentity, saveHostIdentity, type HostIdentity } from '../../src/agent/identity.js';
import { HostRenewal, PendingRenewals, renewalPlan, RENEW_AT, RENEW_CHECK_MS, RENEW_RETRY, type RenewAsk, type RenewedCerts } from '../../src/agent/renewal.js';
import { generateAuthority, generateKeyPair, identityFromCert, issueSshCert, issueTlsCert } from '../../src/auth/pki.js';
import { AuthService } from '../../src/auth/service.js';
import { openSqliteBackend } from '../../src/backend/index.js';
import { GatewayError } from '../../src/errors.js';
import { createLogger, setRootLogger } from '../../src/log.js';
import { ManualClock } from '../helpers/clock.js';
import { waitUntil } from '../helpers/wait.js';

setRootLogger(createLogger({ level: 'silent' }));

const DAY = 24 * 3600_000;
let dir: string;
let backend: ReturnType<typeof openSqliteBackend>;
let auth: AuthService;
let identity: HostIdentity;

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-renewal-'));
  backend = openSqliteBackend({ path: ':memory:', sweepIntervalMs: 0 });
  auth = await AuthService.open({ backend, clusterName: 'renew.example' });
  const keys = generateKeyPair();
  const bundle = await auth.joinLocal({ roles: ['node'], nodename: 'web-1', publicAddrs: [], publicKeyPem: keys.publicKeyPem, sshPublicKey: keys.sshPublicKey });
  saveHostIdentity(dir, keys.privateKeyPem, bundle, { roles: ['node'], nodename: 'web-1', server: 'proxy.example.com:443', joinedVia: 'proxy' });
  identity = loadHostIdentity(dir)!;
});

afterEach(async () => {
  await backend.close();
  await rm(dir, { recursive: true, force: true });
});

/** The Auth Service's answer for the agent's own host ID. */
const fromAuth: RenewAsk = async (publicKeyPem) => {
  const b = await auth.renewHost({ hostId: identity.hostId, publicKeyPem, via: 'test' });
  return { tlsCert: b.tlsCert, sshCert: b.sshCert };
};

const later = (days: number) => () => Date.now() + days * DAY;
const stored = () => readFile(join(dir, 'host', 'cert.pem'), 'utf8');

describe('renewalPlan', () => {
  it('with the SSH certificate: whichever of the two is due first decides', () => {
    const issued = Date.now();
    const sshKey = createPublicKey(identity.key).export({ type: 'spki', format: 'pem' }).toString();
    const shortSsh = issueSshCert(auth.host, { publicKey: sshKey, certType: 'host', keyId: identity.hostId, principals: [identity.hostId], ttlMs: 30 * DAY });
    expect(renewalPlan(identity.cert, issued + 25 * DAY, identity.sshCert).due).toBe(false);
    expect(renewalPlan(identity.cert, issued + 25 * DAY, shortSsh)).toMatchObject({ due: true, reason: expect.stringMatching(/^the SSH certificate expires at/) });
  });

  it(`is due once ${Math.round(RENEW_AT * 100)}% of the lifetime has passed, and says why either way`, () => {
    const issued = Date.now();
    const early = renewalPlan(identity.cert, issued + 200 * DAY);
    expect(early).toMatchObject({ due: false, reason: expect.stringMatching(/^the certificate is valid until .*; renewal from /) });
    expect(early.renewAt.getTime() - issued).toBeGreaterThan(242 * DAY);
    expect(early.renewAt.getTime() - issued).toBeLessThan(245 * DAY);
    expect(renewalPlan(identity.cert, issued + 250 * DAY)).toMatchObject({ due: true, reason: expect.stringMatching(/renewal was due from/) });
    expect(renewalPlan(identity.cert, issued + 400 * DAY)).toMatchObject({ due: true, reason: expect.stringMatching(/^the certificate expired at/) });
  });
});

describe('HostRenewal', () => {
  it('does nothing while the certificate is young', async () => {
    let asked = 0;
    const renewal = new HostRenewal({ identity, dataDir: dir, ask: async () => (asked++, fromAuth('')) });
    expect(await renewal.check()).toBe('not-due');
    expect(asked).toBe(0);
  });

  it('when due: asks once, stores the new certificates, and puts them in use; a check while one runs shares it', async () => {
    const before = identity.cert;
    let asked = 0;
    let renewedWith: string | undefined;
    const ask: RenewAsk = (key) => (asked++, fromAuth(key));
    const renewal = new HostRenewal({ identity, dataDir: dir, ask, clock: later(250), onRenewed: (i) => (renewedWith = i.cert) });
    const [a, b] = await Promise.all([renewal.check(), renewal.check()]);
    expect([a, b]).toEqual(['renewed', 'renewed']);
    expect(asked).toBe(1);
    expect(identity.cert).not.toBe(before);
    expect(renewedWith).toBe(identity.cert);
    expect(await stored()).toBe(identity.cert);
    expect(loadHostIdentity(dir)!.sshCert).toBe(identity.sshCert);
    expect(identityFromCert(identity.cert)).toMatchObject({ kind: 'host', name: identity.hostId });
    // The key stays: the stored private key is unchanged, and the Auth Service recorded the renewal.
    expect((await auth.getNode(identity.hostId))?.renewedAt).toBeDefined();
  });

  it('a failed ask (too soon, no tunnel) changes nothing and is asked again at the next check', async () => {
    const before = identity.cert;
    const fail: RenewAsk = async () => {
      throw new GatewayError('GW_ERR_TUNNEL_DOWN', 'no reverse tunnel is connected to ask for a renewal');
    };
    expect(await new HostRenewal({ identity, dataDir: dir, ask: fail, clock: later(250) }).check()).toBe('failed');
    expect(identity.cert).toBe(before);
    expect(await stored()).toBe(before);
    expect(await new HostRenewal({ identity, dataDir: dir, ask: fromAuth, clock: later(250) }).check()).toBe('renewed');
  });

  it('started: checks every RENEW_CHECK_MS; after failed checks retries by RENEW_RETRY, and a success goes back to the interval', async () => {
    const clock = new ManualClock();
    let failing = 3;
    let asked = 0;
    const ask: RenewAsk = async (key) => {
      asked++;
      if (failing-- > 0) throw new GatewayError('GW_ERR_TUNNEL_DOWN', 'the tunnel closed before the Proxy answered the renewal');
      return fromAuth(key);
    };
    const renewal = new HostRenewal({ identity, dataDir: dir, ask, clock: later(250), timers: clock.deps(() => 0) });
    /** Waits until the check in progress has scheduled the next one, then fires it. */
    const scheduled = async (n: number) => {
      await waitUntil(`check ${n} scheduled the next`, () => clock.delays.length === n);
      expect(clock.pending).toBe(1);
    };
    renewal.start();
    for (let n = 1; n <= 4; n++) {
      await scheduled(n);
      if (n < 4) clock.fireNext();
    }
    renewal.stop();
    expect(asked).toBe(4);
    expect(clock.pending).toBe(0);
    // random 0: half of each ceiling (1, 2, 4 min); then renewed, and the next check an interval later.
    expect(clock.delays).toEqual([RENEW_RETRY.firstMs / 2, RENEW_RETRY.firstMs, RENEW_RETRY.firstMs * 2, RENEW_CHECK_MS]);
  });

  describe('hostile answers are refused, and nothing is stored', () => {
    async function refusedWith(answer: (key: string) => Promise<RenewedCerts>): Promise<void> {
      const before = identity.cert;
      const renewal = new HostRenewal({ identity, dataDir: dir, ask: answer, clock: later(250) });
      expect(await renewal.check()).toBe('failed');
      expect(identity.cert).toBe(before);
      expect(await stored()).toBe(before);
    }

    it("another host's certificates (a real one of this cluster), and one naming another host for this key", async () => {
      const keys = generateKeyPair();
      const other = await auth.joinLocal({ roles: ['node'], nodename: 'web-2', publicAddrs: [], publicKeyPem: keys.publicKeyPem, sshPublicKey: keys.sshPublicKey });
      await refusedWith(async () => ({ tlsCert: other.tlsCert, sshCert: other.sshCert }));
      const renamed = await issueTlsCert(auth.host, { publicKeyPem: await publicKeyOf(identity), identity: identityFromCert(other.tlsCert), ttlMs: DAY, usage: 'both' });
      await refusedWith(async () => ({ tlsCert: renamed, sshCert: identity.sshCert }));
    });

    it('a certificate of its own host ID for another key', async () => {
      const real = await fromAuth(await publicKeyOf(identity));
      const keys = generateKeyPair();
      const tlsCert = await issueTlsCert(auth.host, { publicKeyPem: keys.publicKeyPem, identity: identity.identity, ttlMs: DAY, usage: 'both' });
      await refusedWith(async () => ({ tlsCert, sshCert: real.sshCert }));
    });

    it('a certificate from a CA the agent does not trust', async () => {
      const otherCa = await generateAuthority('host', 'renew.example');
      const tlsCert = await issueTlsCert(otherCa, { publicKeyPem: await publicKeyOf(identity), identity: identity.identity, ttlMs: DAY, usage: 'both' });
      await refusedWith(async () => ({ tlsCert, sshCert: identity.sshCert }));
    });

    it('an older certificate of its own replayed (still valid, but running out before the one in use), and one that expired', async () => {
      const older = await issueTlsCert(auth.host, { publicKeyPem: await publicKeyOf(identity), identity: identity.identity, ttlMs: 300 * DAY, usage: 'both' });
      await refusedWith(async () => ({ tlsCert: older, sshCert: identity.sshCert }));
      const expired = await issueTlsCert(auth.host, { publicKeyPem: await publicKeyOf(identity), identity: identity.identity, ttlMs: DAY, usage: 'both' });
      // At 250 days from now, a certificate of one day has run out.
      await refusedWith(async () => ({ tlsCert: expired, sshCert: identity.sshCert }));
    });

    it("a real TLS certificate with a forged SSH certificate (another CA's), or an SSH certificate running out before the one in use", async () => {
      const real = await fromAuth(await publicKeyOf(identity));
      const otherCa = await generateAuthority('host', 'renew.example');
      const sshKey = await publicKeyOf(identity);
      const forged = issueSshCert(otherCa, { publicKey: sshKey, certType: 'host', keyId: identity.hostId, principals: [identity.hostId], ttlMs: 400 * DAY });
      await refusedWith(async () => ({ tlsCert: (await fromAuthLater(sshKey)).tlsCert, sshCert: forged }));
      const short = issueSshCert(auth.host, { publicKey: sshKey, certType: 'host', keyId: identity.hostId, principals: [identity.hostId], ttlMs: 300 * DAY });
      await refusedWith(async () => ({ tlsCert: real.tlsCert, sshCert: short }));
    });

    it('bytes that are not certificates, and an SSH certificate of another key', async () => {
      await refusedWith(async () => ({ tlsCert: 'not a certificate', sshCert: identity.sshCert }));
      const keys = generateKeyPair();
      const other = await auth.joinLocal({ roles: ['node'], nodename: 'web-3', publicAddrs: [], publicKeyPem: keys.publicKeyPem, sshPublicKey: keys.sshPublicKey });
      await refusedWith(async (key) => ({ tlsCert: (await fromAuthLater(key)).tlsCert, sshCert: other.sshCert }));
    });
  });
});

describe('PendingRenewals', () => {
  it('matches answers by id, ignores an answer nobody waits for, and fails what is in flight when the tunnel goes', async () => {
    const pending = new PendingRenewals();
    const sent: number[] = [];
    const first = pending.ask((id) => sent.push(id));
    const second = pending.ask((id) => sent.push(id));
    pending.answer({ type: 'renewal', id: 99, certs: { tls_cert: 'x', ssh_cert: 'y' } });
    pending.answer({ type: 'renewal', id: sent[1]!, error: { code: 'GW_ERR_HOST_RENEW_TOO_SOON', message: 'renewed at t' } });
    await expect(second).rejects.toMatchObject({ code: 'GW_ERR_HOST_RENEW_TOO_SOON' });
    pending.failAll('control channel closed');
    await expect(first).rejects.toMatchObject({ code: 'GW_ERR_TUNNEL_DOWN', message: expect.stringMatching(/control channel closed/) });
    const third = pending.ask((id) => pending.answer({ type: 'renewal', id, certs: { tls_cert: 'a', ssh_cert: 'b' } }));
    expect(await third).toEqual({ tlsCert: 'a', sshCert: 'b' });
  });

  it('a Proxy that never answers (an earlier version) fails the ask at its deadline; an unknown error code stays readable', async () => {
    const pending = new PendingRenewals();
    await expect(pending.ask(() => undefined, 20)).rejects.toMatchObject({ code: 'GW_ERR_TUNNEL_TIMEOUT', message: expect.stringMatching(/earlier version/) });
    const odd = pending.ask((id) => pending.answer({ type: 'renewal', id, error: { code: 'GW_ERR_FROM_THE_FUTURE', message: 'no' } }));
    await expect(odd).rejects.toMatchObject({ code: 'GW_ERR_INTERNAL', message: 'GW_ERR_FROM_THE_FUTURE: no' });
  });
});

async function publicKeyOf(i: HostIdentity): Promise<string> {
  const { createPublicKey } = await import('node:crypto');
  return createPublicKey(i.key).export({ type: 'spki', format: 'pem' }).toString();
}

/** A renewal an hour later than the last one (the Auth Service's limit), for the tests that need a second one. */
async function fromAuthLater(key: string): Promise<RenewedCerts> {
  const record = (await auth.getNode(identity.hostId))!;
  delete record.renewedAt;
  await backend.put(`/nodes/${identity.hostId}`, JSON.stringify(record));
  return fromAuth(key);
}
