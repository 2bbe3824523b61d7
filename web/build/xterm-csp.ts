/**
 * A build step for xterm.js under a strict Content-Security-Policy: its <style> elements become
 * <gw-xterm-style> elements (web/src/xterm-style.ts), whose rules go to a constructed stylesheet. Pure, so that
 * a test checks it against the installed xterm: if xterm stops creating <style> elements this way, the build
 * fails rather than shipping a terminal without its styles.
 */
export const XTERM_STYLE_TAG = 'gw-xterm-style';

const PATTERN = /\.createElement\((["'])style\1\)/g;

/** The module's text with every createElement("style") rewritten, and how many there were. */
export function rewriteXtermStyles(code: string): { code: string; count: number } {
  let count = 0;
  const out = code.replace(PATTERN, () => {
    count++;
    return `.createElement("${XTERM_STYLE_TAG}")`;
  });
  return { code: out, count };
}

/** Whether a module id is xterm.js's own bundle (not an addon). */
export function isXtermModule(id: string): boolean {
  return /[\\/]@xterm[\\/]xterm[\\/]lib[\\/]xterm\.m?js$/.test(id.split('?')[0]!);
}
