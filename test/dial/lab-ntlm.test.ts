/**
 * The NTLM proxy lab (test/helpers/ntlm.ts) proven with curl as the reference client: squid with Samba's
 * ntlm_auth and winbindd over a local account database, and `curl --proxy-ntlm -U 'GWLAB\user:pass'`. The lab's
 * winbind pipe that Debian's libwbclient looks for at a fixed path is handled with a mount namespace (see the helper).
 * Then the gateway's own NTLMv2 encoding (src/dial/ntlm.ts) in a hand-made CONNECT against the same proxy: the
 * three messages on one kept-alive connection, squid lets the tunnel through and logs the account.
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { ntlmCredentials, ntlmScheme } from '../../src/dial/ntlm.js';
import { connectWithScheme, getThroughTunnel } from '../helpers/connauth.js';
import { curl } from '../helpers/curl.js';
import { startNtlmLab, type NtlmLab } from '../helpers/ntlm.js';
import { rootSuite } from '../helpers/root.js';
import { parseAccessLogLine } from '../helpers/squid.js';

const describeAsRoot = rootSuite(['users', 'mountns']);

describeAsRoot('the NTLM proxy lab, with curl as the client', () => {
  let lab: NtlmLab;
  let web: http.Server;
  let target: string;

  beforeAll(async () => {
    lab = await startNtlmLab();
    web = http.createServer((_req, res) => res.end('behind the ntlm proxy\n'));
    await new Promise<void>((r) => web.listen(0, '127.0.0.3', r));
    target = `http://127.0.0.3:${(web.address() as AddressInfo).port}/`;
  }, 60_000);

  afterAll(async () => {
    web?.closeAllConnections();
    if (web) await new Promise((r) => web.close(r));
    await lab?.stop();
  });

  const curlNtlm = (userpass: string, extra: string[] = []) => curl(['-p', '-x', lab.squid.url, '--proxy-ntlm', '-U', userpass, ...extra, target]);

  it('lets the account through with NTLMv2 on one connection, and squid logs it', async () => {
    const r = await curlNtlm(`${lab.account}:${lab.user.password}`, ['-v']);
    expect(r.stdout).toBe('behind the ntlm proxy\n');
    // The three messages: Type 1, the proxy's Type 2 challenge, Type 3 on the same (re-used) connection.
    expect(r.stderr).toMatch(/Proxy-Authorization: NTLM TlRMTVNTUAABAAAA/);
    expect(r.stderr).toMatch(/Proxy-Authenticate: NTLM TlRMTVNTUAACAAAA/);
    expect(r.stderr).toMatch(/Proxy-Authorization: NTLM TlRMTVNTUAADAAAA/);
    expect(r.stderr).not.toMatch(/Connection #0 .* left intact[\s\S]*Trying/); // no second connection
    const line = await lab.squid.waitForAccessLog((l) => l.includes(' CONNECT ') && l.includes(' 200 '));
    expect(parseAccessLogLine(line).user?.toLowerCase()).toBe(`${lab.domain}\\${lab.user.name}`.toLowerCase());
  });

  it('answers 407 to a wrong password', async () => {
    const r = await curlNtlm(`${lab.account}:not-the-password`, ['-o', '/dev/null', '-w', '%{http_connect}']);
    expect(r.stdout).toBe('407');
  });

  it('answers 407 to an account it does not have', async () => {
    const r = await curlNtlm(`${lab.domain}\\nobody-here:${lab.user.password}`, ['-o', '/dev/null', '-w', '%{http_connect}']);
    expect(r.stdout).toBe('407');
  });

  const hostPort = () => target.slice('http://'.length, -1);

  it('src/dial/ntlm.ts: Type 1, the challenge, Type 3 on one connection; squid lets the CONNECT through', async () => {
    const scheme = ntlmScheme(ntlmCredentials(lab.account, lab.user.password));
    const r = await connectWithScheme(lab.squid, hostPort(), scheme);
    expect(r.error).toBeUndefined();
    expect(r.statuses).toEqual([407, 200]);
    expect(r.sent.map((v) => v.slice(0, 21))).toEqual(['NTLM TlRMTVNTUAABAAAA', 'NTLM TlRMTVNTUAADAAAA']);
    expect(await getThroughTunnel(r.tunnel!, hostPort())).toContain('behind the ntlm proxy');
    const line = await lab.squid.waitForAccessLog((l) => l.includes(' CONNECT ') && l.includes(' 200 ') && l.toLowerCase().includes(lab.user.name));
    expect(parseAccessLogLine(line).user?.toLowerCase()).toBe(`${lab.domain}\\${lab.user.name}`.toLowerCase());
  });

  it('src/dial/ntlm.ts: a wrong password is refused, and the scheme does not answer again', async () => {
    const r = await connectWithScheme(lab.squid, hostPort(), ntlmScheme(ntlmCredentials(lab.account, 'not-the-password')));
    expect(r.tunnel).toBeUndefined();
    expect(r.sent).toHaveLength(2);
    // squid answers the wrong Type 3 with another 407 on the same connection; the scheme refuses to go on.
    expect(r.statuses).toEqual([407, 407]);
    expect(r.error).toMatchObject({ code: 'GW_ERR_DIAL_PROXY_AUTH_REFUSED' });
    expect(String(r.error)).not.toContain('not-the-password');
  });
});
