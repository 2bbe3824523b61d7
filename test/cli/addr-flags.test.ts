/**
 * Addresses given on the command line go through the same parser as the configuration (src/addr.ts): a bad one
 * is a usage error (status 2) naming the value and what is wrong with it, before anything is dialled or sent.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli, startGatewayExpectingFailure } from '../helpers/gateway.js';

let dir: string;
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-addr-flags-'));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe('address flags', () => {
  it.each([
    ['10.0.0.256:443', 'over 255'],
    ['999.999.999.999:443', 'over 255'],
    ['1.2.3:443', 'four'],
    ['foo_bar.example.com:443', '"_"'],
    ['proxy.example.com:99999', '1-65535'],
  ])('gwsh login --proxy=%s is refused (%s)', async (addr, why) => {
    const r = await runCli('gwsh', ['login', `--proxy=${addr}`, '--user=alice', `--ca-pin=sha256:${'0'.repeat(64)}`], { env: { HOME: dir, GWSH_HOME: join(dir, 'gwsh') }, input: 'pw\n' });
    expect(r.status).toBe(2);
    expect(r.stderr).toContain(addr);
    expect(r.stderr).toContain(why);
    expect(r.stderr).toMatch(/^hint: .+/m);
    expect(r.stderr).toContain('code: GW_ERR_USAGE');
  });

  it.each([
    ['--proxy', '300.1.1.1:443'],
    ['--auth-server', 'auth_1.example.com:3025'],
  ])('gateway start %s %s is refused before joining', async (flag, addr) => {
    const config = ['gateway:', '  nodename: n1', '  data_dir: DATA_DIR', 'ssh_service:', '  enabled: yes', ''].join('\n');
    const r = await startGatewayExpectingFailure(config, ['--token', 'f'.repeat(32), '--ca-pin', `sha256:${'0'.repeat(64)}`, flag, addr]);
    expect(r.status).toBe(2);
    expect(r.stderr).toContain(addr);
    expect(r.stderr).toContain('code: GW_ERR_USAGE');
  });

  it.each([['300.1.1.1:3000', 'over 255'], [':3000', 'no host']])('gateway start --diag-addr %s is refused before anything starts (%s)', async (addr, why) => {
    const config = ['gateway:', '  nodename: n1', '  data_dir: DATA_DIR', 'ssh_service:', '  enabled: yes', ''].join('\n');
    const r = await startGatewayExpectingFailure(config, ['--diag-addr', addr]);
    expect(r.status).toBe(2);
    expect(r.stderr).toContain(addr);
    expect(r.stderr).toContain(why);
    expect(r.stderr).toContain('code: GW_ERR_USAGE');
  });

  it('gateway dial-plan names the bad part of a target', async () => {
    const r = await runCli('gateway', ['dial-plan', 'https://1.2.3/webapi/ping', 'foo_bar.example.com:443']);
    expect(r.status).toBe(1);
    const lines = r.stdout.trim().split('\n');
    expect(lines[0]).toContain('GW_ERR_DIAL_BAD_TARGET');
    expect(lines[0]).toContain('four');
    expect(lines[2]).toContain('GW_ERR_DIAL_BAD_TARGET');
    expect(lines[2]).toContain('"_"');
  });
});
