/**
 * Cheap, bounded checks that run on a request body before a parser does: how deeply JSON or YAML nests. A
 * parser given 1 MiB of `[[[[…` or `- - - - …` spends seconds and a gigabyte building what it will then refuse;
 * these scans read each byte once and keep one counter, so a hostile body costs no more than its length.
 */

/** The deepest nesting of [ and { in JSON text (outside strings), stopping early once over max. */
export function jsonDepth(text: string, max: number): number {
  let depth = 0;
  let deepest = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === 0x5c) i++; // backslash: skip the escaped character
      else if (c === 0x22) inString = false;
      continue;
    }
    if (c === 0x22) inString = true;
    else if (c === 0x5b || c === 0x7b) {
      depth++;
      if (depth > deepest) {
        deepest = depth;
        if (deepest > max) return deepest;
      }
    } else if (c === 0x5d || c === 0x7d) depth--;
  }
  return deepest;
}

/**
 * An upper bound of how deeply a YAML text nests: per line, its indentation plus the block indicators (`- `,
 * `? `) that open a level on the same line, plus the flow brackets still open. It over-counts (two spaces of
 * indentation count as two), never under-counts, so a limit on it is a limit on the real depth.
 */
export function yamlNestingBound(text: string, max: number): number {
  let deepest = 0;
  let flow = 0;
  for (const line of text.split('\n')) {
    let i = 0;
    while (i < line.length && line[i] === ' ') i++;
    let level = i;
    while (i + 1 < line.length && (line[i] === '-' || line[i] === '?') && line[i + 1] === ' ') {
      level += 2;
      i += 2;
      while (i < line.length && line[i] === ' ') i++;
    }
    for (; i < line.length; i++) {
      const c = line[i];
      if (c === '#' && (i === 0 || line[i - 1] === ' ')) break;
      if (c === '[' || c === '{') flow++;
      else if ((c === ']' || c === '}') && flow > 0) flow--;
      if (level + flow > deepest) deepest = level + flow;
    }
    if (level > deepest) deepest = level;
    if (deepest > max) return deepest;
  }
  return deepest;
}
