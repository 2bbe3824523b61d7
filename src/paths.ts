/**
 * Where a gateway run by this user keeps its state, and which web port it takes, when the configuration does
 * not say. Root gets the system's places (/var/lib/gateway, port 443); any other user gets places it can use
 * without privileges: $XDG_STATE_HOME/gateway (~/.local/state/gateway) and port 3080.
 */
import { homedir } from 'node:os';
import { isAbsolute, join } from 'node:path';

export const SYSTEM_DATA_DIR = '/var/lib/gateway';
/** The web port for a user who may not bind ports below 1024. */
export const UNPRIVILEGED_WEB_PORT = 3080;

export function isRoot(): boolean {
  return process.getuid?.() === 0;
}

export function defaultDataDir(env: NodeJS.ProcessEnv = process.env, root = isRoot()): string {
  if (root) return SYSTEM_DATA_DIR;
  const state = env.XDG_STATE_HOME && isAbsolute(env.XDG_STATE_HOME) ? env.XDG_STATE_HOME : join(env.HOME || homedir(), '.local', 'state');
  return join(state, 'gateway');
}

export function defaultWebPort(root = isRoot()): number {
  return root ? 443 : UNPRIVILEGED_WEB_PORT;
}
