module vhosts

go 1.19
