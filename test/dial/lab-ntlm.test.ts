/**
 * The NTLM proxy lab (test/helpers/ntlm.ts) proven with curl as the reference client: squid with Samba's
 * ntlm_auth and winbindd over a local account database, and `curl --proxy-ntlm -U 'GWLAB\user:pass'`. The lab's
 * winbind pipe that Debian's libwbclient looks for at a fixed path is handled with a mount namespace (see the helper).
 * Then the Dialer through the same proxy with its NTLM scheme (src/dial/auth/ntlm.ts, NTLMv2 encoded by
 * ntlmv2.ts): the three messages on one kept-alive connection, squid lets the tunnel through and logs the
 * account; a wrong password is refused once, and appears in no message and no log line.
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { Dialer, dialRoute } from '../../src/dial/dialer.js';
import { dialError } from '../helpers/dial.js';
import { getThroughTunnel, labLookup, WEB_NAME, webHostsFile } from '../helpers/labdial.js';
import { captureLogs } from '../helpers/logs.js';
import { curl } from '../helpers/curl.js';
import { startNtlmLab, type NtlmLab } from '../helpers/ntlm.js';
import { rootSuite } from '../helpers/root.js';
import { parseAccessLogLine } from '../helpers/squid.js';

const describeAsRoot = rootSuite(['users', 'mountns']);
const logLines = captureLogs();

describeAsRoot('the NTLM proxy lab, with curl as the client', () => {
  let lab: NtlmLab;
  let web: http.Server;
  let target: string;
  let webPort: number;

  beforeAll(async () => {
    lab = await startNtlmLab({ squidConfig: [`hosts_file ${await webHostsFile()}`] });
    web = http.createServer((_req, res) => res.end('behind the ntlm proxy\n'));
    await new Promise<void>((r) => web.listen(0, '127.0.0.3', r));
    webPort = (web.address() as AddressInfo).port;
    target = `http://127.0.0.3:${webPort}/`;
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

  const webTarget = () => `${WEB_NAME}:${webPort}`;
  const dialer = (userpass: string) =>
    new Dialer({ env: { HTTPS_PROXY: `http://${userpass}@ntlm.gw.test:${lab.squid.port}` }, lookup: labLookup, connectTimeoutMs: 5_000, proxyAnswerTimeoutMs: 5_000 });
  const enc = encodeURIComponent;

  it('the Dialer: Type 1, the challenge, Type 3 on one connection; squid lets the CONNECT through and logs the account', async () => {
    const socket = await dialer(`${enc(lab.account)}:${enc(lab.user.password)}`).dial(webTarget());
    expect(dialRoute(socket)?.proxy?.auth).toBe('NTLM'); // what dial-plan --probe prints
    expect(await getThroughTunnel(socket, webTarget())).toContain('behind the ntlm proxy');
    const line = await lab.squid.waitForAccessLog((l) => l.includes(' CONNECT ') && l.includes(webTarget()) && l.includes(' 200 ') && l.toLowerCase().includes(lab.user.name));
    expect(parseAccessLogLine(line).user?.toLowerCase()).toBe(`${lab.domain}\\${lab.user.name}`.toLowerCase());
  });

  it('the Dialer: a wrong password is refused once (GW_ERR_DIAL_PROXY_AUTH_REFUSED), never in the message or the log', async () => {
    const before = logLines.length;
    const err = await dialError(dialer(`${enc(lab.account)}:not-the-password`), webTarget());
    expect(err.code).toBe('GW_ERR_DIAL_PROXY_AUTH_REFUSED');
    expect(err.message).toContain('NTLM');
    expect(err.hint).toMatch(/DOMAIN%5Cuser/);
    const text = `${err.message} ${JSON.stringify(err.details)} ${logLines.slice(before).join('')}`;
    expect(text).not.toContain('not-the-password');
    expect(text).not.toMatch(/TlRMTVNT/);
  });
});
