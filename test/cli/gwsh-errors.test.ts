/**
 * gwsh's errors point at the real fix, with the built CLIs against a running gateway: an expired user certificate
 * has its own code (GW_ERR_CLIENT_CERT_EXPIRED, from gwsh before it connects and from the Auth API when a client
 * presents one) whose hint, followed, signs in again; and `gwsh ssh` (real OpenSSH) ends with the ProxyCommand's
 * real error, after OpenSSH's own lines, and exit status 1.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ApiClient } from '../../src/client/api.js';
import { loadProfile } from '../../src/client/profile.js';
import { runCli, startGateway, type RunningGateway } from '../helpers/gateway.js';
import { failureOf } from '../helpers/errors.js';
import { waitUntil } from '../helpers/wait.js';

const PASSWORD = 'Expired-Passw0rd';
let gw: RunningGateway;
let home: string;
let pin: string;
const env = () => ({ GWSH_HOME: home, HOME: home });
const gwsh = (args: string[], input?: string) => runCli('gwsh', args, { env: env(), ...(input === undefined ? {} : { input }) });

beforeAll(async () => {
  gw = await startGateway('gateway:\n  data_dir: DATA_DIR\nauth_service:\n  listen_addr: 127.0.0.1:0\nproxy_service:\n  web_listen_addr: 127.0.0.1:0\n');
  home = await mkdtemp(join(tmpdir(), 'gw-gwsh-errors-'));
  const status = await runCli('gwctl', ['--data-dir', gw.dataDir, 'status']);
  pin = /sha256:[0-9a-f]{64}/.exec(status.stdout)![0];
  expect((await runCli('gwctl', ['--data-dir', gw.dataDir, 'users', 'add', 'bob', '--roles=access', '--logins=root'], { input: `${PASSWORD}\n` })).status).toBe(0);
}, 60_000);
afterAll(async () => {
  await gw?.stop();
  if (home) await rm(home, { recursive: true, force: true });
});

const login = (ttl?: string) => gwsh(['login', `--proxy=${gw.addresses.web}`, '--user=bob', `--ca-pin=${pin}`, ...(ttl ? [`--ttl=${ttl}`] : [])], `${PASSWORD}\n`);

describe('an expired user certificate', () => {
  it('gwsh says so with its own code and the login command; the login it names makes the same command work', async () => {
    expect((await login('2s')).status).toBe(0);
    await waitUntil('the certificate has expired', () => Date.parse(loadProfile(home)!.valid_until) < Date.now());
    const r = await gwsh(['ls']);
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('code: GW_ERR_CLIENT_CERT_EXPIRED');
    const command = /^hint: Run '(gwsh login [^']+)' for a fresh one\.$/m.exec(r.stderr)?.[1];
    expect(command).toBe(`gwsh login --proxy=${gw.addresses.web} --user=bob`);
    // Followed as written (the password typed in, the CA pin remembered from the first login).
    const again = await gwsh(command!.split(' ').slice(1), `${PASSWORD}\n`);
    expect(again.status, again.stderr).toBe(0);
    expect((await gwsh(['ls'])).status).toBe(0);
  });

  it('presented to the Auth API anyway (a client that does not check), it is refused with the same code', async () => {
    expect((await login('2s')).status).toBe(0);
    const profile = loadProfile(home)!;
    await waitUntil('the certificate has expired', () => Date.parse(profile.valid_until) < Date.now());
    const client = new ApiClient({ address: profile.proxy, ca: profile.hostCa, cert: profile.cert, key: profile.key });
    const err = await failureOf(client.call('GET', '/v1/inventory/node'));
    expect(err.code).toBe('GW_ERR_CLIENT_CERT_EXPIRED');
    expect(err.hint).toContain('gwsh login');
  });
});

describe('gwsh ssh when its ProxyCommand fails', () => {
  it("ends with the real error (after OpenSSH's lines) and exit status 1", async () => {
    expect((await login()).status).toBe(0);
    const r = await gwsh(['ssh', '-o', 'BatchMode=yes', 'root@no-such-node', 'true']);
    expect(r.status).toBe(1);
    const lines = r.stderr.trimEnd().split('\n');
    expect(lines.at(-3)).toBe('error: the connection through the gateway failed: no connected agent serves node "no-such-node"');
    expect(lines.at(-2)).toMatch(/^hint: /);
    expect(lines.at(-1)).toBe('code: GW_ERR_TUNNEL_NOT_FOUND');
    // Said once: the ProxyCommand left it to gwsh ssh rather than printing it before OpenSSH's lines.
    expect(r.stderr.split('no connected agent serves').length).toBe(2);
  });
});

describe('--debug after the subcommand', () => {
  it('gwsh proxy app X --debug is the same command as gwsh --debug proxy app X: its real error with the stack, not a usage error', async () => {
    expect((await login()).status).toBe(0);
    const before = await gwsh(['--debug', 'proxy', 'app', 'no-such-app', '--port', '0']);
    const after = await gwsh(['proxy', 'app', 'no-such-app', '--port', '0', '--debug']);
    for (const r of [before, after]) {
      expect(r.stderr).not.toContain('GW_ERR_USAGE');
      expect(r.stderr).toMatch(/\n\s+at /); // the stack trace --debug asks for
    }
    const code = (r: { stderr: string }) => /code: (\S+)/.exec(r.stderr)?.[1];
    expect(code(after)).toBe(code(before));
  });
});
