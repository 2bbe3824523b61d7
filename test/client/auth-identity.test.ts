/**
 * The Auth API's clients (gwctl, a Proxy in its own process, agents joined to the Auth Service) require the
 * server's certificate to say role auth: every host certificate chains to the same host CA, so without it an
 * agent or a Proxy with a network position could answer as the Auth Service.
 */
import https from 'node:https';
import type net from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { generateAuthority, generateKeyPair, issueTlsCert } from '../../src/auth/pki.js';
import { ApiClient } from '../../src/client/api.js';
import { Dialer } from '../../src/dial/dialer.js';

let server: https.Server | undefined;
afterEach(() => void server?.close());

async function serveWith(roles: string[]): Promise<{ address: string; ca: string }> {
  const ca = await generateAuthority('host', 'roles.example');
  const keys = generateKeyPair();
  const cert = await issueTlsCert(ca, { publicKeyPem: keys.publicKeyPem, identity: { kind: 'host', name: 'h1', cluster: 'roles.example', roles }, dnsNames: ['localhost'], ipAddresses: ['127.0.0.1'], ttlMs: 3600_000, usage: 'both' });
  server = https.createServer({ key: keys.privateKeyPem, cert }, (_req, res) => res.end('{"ok":true}'));
  await new Promise<void>((r) => server!.listen(0, '127.0.0.1', r));
  return { address: `127.0.0.1:${(server.address() as net.AddressInfo).port}`, ca: ca.tls.certPem };
}

describe("the Auth API's certificate", () => {
  it('with role auth: the call goes through', async () => {
    const { address, ca } = await serveWith(['auth']);
    await expect(new ApiClient({ address, ca, server: 'auth', dialer: new Dialer({ env: {} }) }).call('GET', '/v1/status')).resolves.toEqual({ ok: true });
  });

  it("hostile: an agent's or a Proxy's host certificate from the same CA is refused as the Auth Service", async () => {
    for (const roles of [['node'], ['proxy']]) {
      const { address, ca } = await serveWith(roles);
      await expect(new ApiClient({ address, ca, server: 'auth', dialer: new Dialer({ env: {} }) }).call('GET', '/v1/status')).rejects.toThrow(/not an Auth Service's/);
      server?.close();
    }
  });

  it("a Proxy's certificate is what a Proxy's web port needs (role proxy)", async () => {
    const { address, ca } = await serveWith(['proxy']);
    await expect(new ApiClient({ address, ca, dialer: new Dialer({ env: {} }) }).call('GET', '/webapi/ping')).resolves.toEqual({ ok: true });
  });

  it("hostile: an agent's host certificate from the same CA, with the Proxy's name, is refused as the Proxy (GW_ERR_TLS_WRONG_ROLE), and so is the Auth Service's", async () => {
    for (const roles of [['node'], ['db', 'app'], ['auth'], []]) {
      const { address, ca } = await serveWith(roles);
      const err = await new ApiClient({ address, ca, dialer: new Dialer({ env: {} }) }).call('GET', '/webapi/ping').catch((e: unknown) => e);
      expect(err).toMatchObject({ code: 'GW_ERR_TLS_WRONG_ROLE' });
      server?.close();
    }
  });
});
