/**
 * /etc/gateway-upgrade.d/endpoint: one line
 *
 *   <host>:<port>/v1/webapi/automaticupgrades/channel/<channel>
 *
 * with no https:// prefix and no /version suffix. The upgrader asks https://<endpoint>/version and
 * https://<endpoint>/critical. Blank lines and lines starting with # are ignored; the port defaults to 443; a
 * trailing "/" is dropped. Anything else is refused with a message that shows the value and the expected shape.
 */
import { readFile } from 'node:fs/promises';
import { AddrError, formatHostPort, parseAddr } from '../addr.js';
import { GatewayError } from '../errors.js';
import { DEFAULT_CHANNEL, VERSION_SERVER_PREFIX } from '../wire/versions.js';

export const ENDPOINT_FILE = 'endpoint';
/** The path every endpoint has: the Proxy's version server (src/wire/versions.ts). */
const ENDPOINT_PATH_PREFIX = VERSION_SERVER_PREFIX;
export const ENDPOINT_SHAPE = `<host>:<port>${ENDPOINT_PATH_PREFIX}<channel>`;
export const ENDPOINT_EXAMPLE = `proxy.example.com:443${ENDPOINT_PATH_PREFIX}${DEFAULT_CHANNEL}`;

export interface Endpoint {
  host: string;
  port: number;
  /** The channel name, which may contain "/" (stable/v17). */
  channel: string;
  /** host:port/v1/webapi/automaticupgrades/channel/<channel>, normalised. */
  value: string;
  /** https://<value>: append /version or /critical. */
  base: string;
  /** https://host:port: the Proxy's web address (for /webapi/ping). */
  origin: string;
}

const SEGMENT = /^[A-Za-z0-9._~+%-]+$/;

function shown(text: string): string {
  return JSON.stringify(text.length > 120 ? `${text.slice(0, 120)}…` : text);
}

/** Parses the endpoint value; `source` names where it came from (the file path) in errors. */
export function parseEndpoint(text: string, source = 'the endpoint'): Endpoint {
  const lines = text
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l !== '' && !l.startsWith('#'));
  const fail = (why: string, value: string, hint?: string): never => {
    throw new GatewayError('GW_ERR_UPGRADE_ENDPOINT', `${source} holds ${shown(value)}: ${why}; expected ${ENDPOINT_SHAPE}, e.g. ${ENDPOINT_EXAMPLE}`, {
      hint: hint ?? `Write exactly one line of the form ${ENDPOINT_SHAPE}: no https:// in front, no /version at the end.`,
      details: { source, value },
    });
  };
  if (lines.length === 0) fail('it is empty', text.trim());
  if (lines.length > 1) fail(`it has ${lines.length} values, one line is expected`, lines.join(' | '));
  const value = lines[0]!;
  const scheme = /^([a-z][a-z0-9+.-]*):\/\//i.exec(value);
  if (scheme) {
    const without = value.slice(scheme[0].length);
    fail(`it starts with ${scheme[0]}, which the upgrader adds itself`, value, `Remove "${scheme[0]}": write ${without.replace(/\/(version|critical)\/*$/, '')}`);
  }
  if (/\s/.test(value)) fail('it contains spaces', value);
  if (/[?#]/.test(value)) fail('it contains a query or fragment', value);
  const trimmed = value.replace(/\/+$/, '');
  // A suffix only when a channel is left in front of it (a channel may itself be named "critical").
  if (/\/channel\/.+\/(version|critical)$/.test(trimmed) || /^[^/]*\/(version|critical)$/.test(trimmed)) {
    const fixed = trimmed.replace(/\/(version|critical)$/, '');
    fail(`it ends with /${/\/(version|critical)$/.exec(trimmed)![1]}, which the upgrader adds itself`, value, `Remove the suffix: write ${fixed}`);
  }
  const slash = trimmed.indexOf('/');
  if (slash < 0) fail('it has no /v1/webapi/automaticupgrades/channel/<channel> path', value);
  const addrText = trimmed.slice(0, slash);
  const path = trimmed.slice(slash);
  let host: string;
  let port: number;
  try {
    const addr = parseAddr(addrText);
    host = addr.host;
    port = addr.port ?? 443;
  } catch (err) {
    return fail(`the address ${shown(addrText)} is not valid (${err instanceof AddrError ? err.message : String(err)})`, value);
  }
  if (`${path}/` === ENDPOINT_PATH_PREFIX) fail('it names no channel', value);
  if (!path.startsWith(ENDPOINT_PATH_PREFIX)) fail(`the path ${shown(path)} does not start with ${ENDPOINT_PATH_PREFIX}`, value);
  const channel = path.slice(ENDPOINT_PATH_PREFIX.length);
  if (channel === '') fail('it names no channel', value);
  for (const seg of channel.split('/')) {
    if (seg === '' || seg === '.' || seg === '..' || !SEGMENT.test(seg)) fail(`the channel ${shown(channel)} is not a valid channel name`, value);
  }
  const hp = formatHostPort(host, port);
  const normalised = `${hp}${ENDPOINT_PATH_PREFIX}${channel}`;
  return { host, port, channel, value: normalised, base: `https://${normalised}`, origin: `https://${hp}` };
}

/** Reads and parses the endpoint file; a missing file is GW_ERR_UPGRADE_ENDPOINT with the shape to write. */
export async function readEndpointFile(path: string): Promise<Endpoint> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    throw new GatewayError(
      'GW_ERR_UPGRADE_ENDPOINT',
      code === 'ENOENT' ? `${path} does not exist` : `${path} cannot be read (${code ?? 'error'})`,
      { cause: err, hint: `Write the Proxy's version endpoint there, one line: ${ENDPOINT_SHAPE}, e.g. ${ENDPOINT_EXAMPLE}`, details: { path } },
    );
  }
  return parseEndpoint(text, path);
}
