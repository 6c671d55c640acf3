# cmake -DIN=capsule.md -DOUT=capsule.1.md -DVERSION=X -P capsuleManTitle.cmake
# The manual's first line "# capsule(1)" reads well on GitHub; go-md2man takes the first heading
# as the man page's title line: NAME SECTION DATE SOURCE MANUAL.
file(READ ${IN} text)
string(REGEX REPLACE "^# capsule\\(1\\)\n"
       "# capsule 1 \"\" \"capsule ${VERSION}\" \"User Commands\"\n" text "${text}")
file(WRITE ${OUT} "${text}")
