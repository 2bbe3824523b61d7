/** /etc/gateway-upgrade.d/endpoint: the one accepted shape, and clear refusals that show the value (seed Errors rule 1). */
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { GatewayError } from '../../src/errors.js';
import { parseEndpoint, readEndpointFile } from '../../src/upgrade/endpoint.js';

function refusal(text: string): GatewayError {
  try {
    parseEndpoint(text, '/etc/gateway-upgrade.d/endpoint');
  } catch (err) {
    if (err instanceof GatewayError) return err;
    throw err;
  }
  throw new Error(`accepted ${JSON.stringify(text)}`);
}

describe('parseEndpoint', () => {
  it.each([
    ['proxy.example.com:443/v1/webapi/automaticupgrades/channel/default', 'proxy.example.com', 443, 'default'],
    ['proxy.example.com:3080/v1/webapi/automaticupgrades/channel/stable/v17\n', 'proxy.example.com', 3080, 'stable/v17'],
    ['# written by the installer\n\nPROXY.example.com:443/v1/webapi/automaticupgrades/channel/stable/cloud/\n', 'proxy.example.com', 443, 'stable/cloud'],
    ['[2001:db8::1]:443/v1/webapi/automaticupgrades/channel/default', '2001:db8::1', 443, 'default'],
    ['10.0.0.5/v1/webapi/automaticupgrades/channel/default', '10.0.0.5', 443, 'default'],
    ['p:443/v1/webapi/automaticupgrades/channel/critical', 'p', 443, 'critical'],
  ])('accepts %j', (text, host, port, channel) => {
    const e = parseEndpoint(text);
    expect(e).toMatchObject({ host, port, channel });
    expect(e.base).toBe(`https://${e.value}`);
    expect(e.value.endsWith(`/v1/webapi/automaticupgrades/channel/${channel}`)).toBe(true);
  });

  it('refuses https:// and shows the value, the expected shape and the corrected value', () => {
    const e = refusal('https://proxy.example.com:443/v1/webapi/automaticupgrades/channel/default\n');
    expect(e.code).toBe('GW_ERR_UPGRADE_ENDPOINT');
    expect(e.message).toContain('"https://proxy.example.com:443/v1/webapi/automaticupgrades/channel/default"');
    expect(e.message).toContain('expected <host>:<port>/v1/webapi/automaticupgrades/channel/<channel>');
    expect(e.message).toContain('/etc/gateway-upgrade.d/endpoint');
    expect(e.hint).toContain('write proxy.example.com:443/v1/webapi/automaticupgrades/channel/default');
  });

  it('refuses a /version suffix (and /critical) and says what to write', () => {
    const e = refusal('proxy.example.com:443/v1/webapi/automaticupgrades/channel/default/version');
    expect(e.message).toContain('ends with /version');
    expect(e.hint).toBe('Remove the suffix: write proxy.example.com:443/v1/webapi/automaticupgrades/channel/default');
    expect(refusal('https://p:443/v1/webapi/automaticupgrades/channel/default/version').hint).toContain('write p:443/v1/webapi/automaticupgrades/channel/default');
    expect(refusal('p:443/v1/webapi/automaticupgrades/channel/x/critical').message).toContain('/critical');
  });

  it.each([
    ['', 'empty'],
    ['proxy.example.com:443', 'no /v1/webapi'],
    ['proxy.example.com:443/v1/webapi/automaticupgrades/channel/', 'no channel'],
    ['proxy.example.com:443/webapi/automaticupgrades/channel/default', 'does not start with'],
    ['proxy.example.com:99999/v1/webapi/automaticupgrades/channel/default', 'not valid'],
    ['proxy example.com:443/v1/webapi/automaticupgrades/channel/default', 'spaces'],
    ['p:443/v1/webapi/automaticupgrades/channel/a/../b', 'not a valid channel'],
    ['p:443/v1/webapi/automaticupgrades/channel/default?x=1', 'query'],
    ['a:1/v1/webapi/automaticupgrades/channel/x\nb:2/v1/webapi/automaticupgrades/channel/y', '2 values'],
    ['http://p:443/v1/webapi/automaticupgrades/channel/x', 'starts with http://'],
  ])('refuses %j (%s)', (text, why) => {
    const e = refusal(text);
    expect(e.code).toBe('GW_ERR_UPGRADE_ENDPOINT');
    expect(e.message).toContain(why);
    expect(e.message).toContain('expected <host>:<port>/v1/webapi/automaticupgrades/channel/<channel>');
  });

  it('never throws anything but GW_ERR_UPGRADE_ENDPOINT (property)', () => {
    fc.assert(
      fc.property(fc.string({ maxLength: 200 }), (text) => {
        try {
          parseEndpoint(text);
        } catch (err) {
          expect(err).toBeInstanceOf(GatewayError);
          expect((err as GatewayError).code).toBe('GW_ERR_UPGRADE_ENDPOINT');
        }
      }),
    );
  });

  it('round-trips: a parsed value parses to itself', () => {
    const seg = fc.stringMatching(/^[a-z0-9][a-z0-9._-]{0,10}$/).filter((s) => s !== '.' && s !== '..');
    fc.assert(
      fc.property(fc.stringMatching(/^[a-z]([a-z0-9-]{0,9}[a-z0-9])?(\.[a-z]([a-z0-9-]{0,9}[a-z0-9])?){0,3}$/), fc.integer({ min: 1, max: 65535 }), fc.array(seg, { minLength: 1, maxLength: 3 }), (host, port, segs) => {
        const text = `${host}:${port}/v1/webapi/automaticupgrades/channel/${segs.join('/')}`;
        const e = parseEndpoint(text);
        expect(e.channel).toBe(segs.join('/'));
        expect(parseEndpoint(e.value)).toEqual(e);
      }),
    );
  });

  it('a missing file says where and what to write', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'gw-endpoint-'));
    try {
      await expect(readEndpointFile(join(dir, 'endpoint'))).rejects.toMatchObject({ code: 'GW_ERR_UPGRADE_ENDPOINT', message: `${join(dir, 'endpoint')} does not exist` });
      await writeFile(join(dir, 'endpoint'), 'p:443/v1/webapi/automaticupgrades/channel/default\n');
      expect((await readEndpointFile(join(dir, 'endpoint'))).channel).toBe('default');
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});
